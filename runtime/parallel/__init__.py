"""Pipeline and data parallelism as data: layouts, stage partitions, schedules (all torch-free), and
the executor that runs a node's schedule over a generation's process groups (torch).

Nothing is imported here, so the torch-free modules load without torch."""
