"""Planner: profiler, learned profile predictor, throughput model and plan search (no Django)."""
