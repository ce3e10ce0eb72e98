"""Recipe sections → the objects they describe, for the entry points (`cli`, `commands`).

`build`: generation engines, search engines and noise schedules, with `GENERATION_ENGINES` and
`SEARCH_ENGINES`, a builder for each engine kind the recipe modules name. `train`: what `simsearch
train` builds around the RL step (learner, rollout weights, the step's and the update's inputs,
validation, checkpoints). The only package below the entry points that reads the whole recipe.
"""
