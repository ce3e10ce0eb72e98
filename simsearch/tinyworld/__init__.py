"""The quickstart's tiny world: a synthetic corpus with its QA sets (`world`) and the short
supervised pretraining that teaches a tiny policy the tag format on it (`pretrain`).

Used by `simsearch quickstart`, its tests and the benchmarks; no library package imports it.
"""
