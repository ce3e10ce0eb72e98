"""Experiments on simsearch's own commands: the tiny-world pipeline behind `simsearch quickstart`.

`pipeline` runs the quickstart's stages (world, base pretraining, simulator data and fine-tuning, RL,
evaluation), each under its fingerprint, and installs the default world's released models;
`quickstart` is the `simsearch quickstart` entry, which runs them in order and writes the report;
`release` builds and ships those released models (`python -m simsearch.experiments.release runs/release`);
`stages` runs one command as a stage under its fingerprint. The benchmarks build on `pipeline` and
`stages`, and never import a command. This package sits one floor above `commands`, whose entry points
it runs: only `cli` imports it, and the library (`commands` and below) never does.
"""
