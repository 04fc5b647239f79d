"""spotpipe training runtime: the job contract (`config`, torch-free) and one subpackage per job:
models, parallel, distributed, checkpointing, train, strategies, data, planner, sim (docs/runtime.md)."""
