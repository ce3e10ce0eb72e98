"""Recipe sections → the objects they describe, for the entry points (`cli`, `commands`).

`build`: generation engines, search engines and noise schedules, with `GENERATION_ENGINES` and
`SEARCH_ENGINES`, a builder for each engine kind the recipe modules name. `train`: what `simsearch
train` builds around the RL update (learner, rollout weights, update settings, validation,
checkpoints); `step`: what its loop does with them each step (rollout rounds, rewards, batch,
advantages). The only package below the entry points that reads the recipe.
"""
