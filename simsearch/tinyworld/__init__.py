"""The quickstart's tiny world: a synthetic corpus with its QA sets (`world`, `values`), the traces that teach a
tiny policy the tag format on it (`traces`), their short supervised pretraining (`pretrain`), and what the
pretrained policy can do before RL (`diagnostics`).

Used by `simsearch quickstart`, its tests and the benchmarks; no library package imports it.
"""
