"""Recipe sections → the objects they describe, for the entry points (`cli`, `commands`).

`build`: generation engines, search engines and noise schedules, with the `GENERATION_ENGINES` and
`SEARCH_ENGINES` tables the recipe checks read. `train`: what `simsearch train` builds around the RL
update (learner, rollout weights, update settings, validation, checkpoints). The only package below
the entry points that reads the recipe.
"""
