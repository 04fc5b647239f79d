"""Benchmarks: `python -m bench NAME [--quick] [--json PATH]`.

Each benchmark is a module `bench/<name>.py` with a function
`run(*, quick: bool, progress: Progress) -> dict` that measures its baselines in the same run,
prints readable tables with `bench.report.print_table`, and returns the figures as a JSON-ready
dict with self-explaining keys.
"""
