"""Recipe sections → the objects they describe, for the entry points (`cli`, `commands`).

`build`: generation engines, search engines and noise schedules, with the `GENERATION_ENGINES` and
`SEARCH_ENGINES` tables the recipe checks read. `train`: what `simsearch train` builds around the RL
update (learner, rollout weights, update settings, validation, checkpoints); `step`: what its loop
does with them each step (rollout rounds, rewards, batch, advantages). The only package below the
entry points that reads the recipe.
"""
