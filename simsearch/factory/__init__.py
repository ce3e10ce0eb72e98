"""Recipe sections → the objects they describe, for the entry points (`cli`, `commands`).

`build`: generation engines, search engines, noise schedules; `train`: what `simsearch train`
builds around the RL step. The only package below the entry points that reads the whole recipe.
"""
