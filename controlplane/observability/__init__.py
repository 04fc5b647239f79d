"""Operational endpoints and plumbing: Prometheus metrics, health, structured logs, rate limits."""
