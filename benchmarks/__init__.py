"""simsearch's benchmarks: each module measures one claim of the docs (speed, robustness, ablations,
controls) and says in its docstring what it runs and which doc holds its figures; `benchlib` holds
what several share.

Run one as a module from the repository root, where `benchmarks` and `tests` (some benchmarks reuse
the test suite's worlds and generators) import as packages:

    python -m benchmarks.NAME [OPTIONS]     # e.g. python -m benchmarks.fuzz --tiny

The library never imports this package (tests/test_architecture.py), and the wheel does not ship it.
"""
