"""The trainer (one process per node across generations), its per-layer optimizer state, the
single-process reference it must reproduce, the local launcher and the metrics log."""
