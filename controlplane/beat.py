"""Periodic tasks (django-celery-beat syncs this table into its database schedule).

One entry per periodic task; each app adds its own line here."""

from __future__ import annotations

from controlplane.tunables import tunable_from_env

BEAT_SCHEDULE: dict[str, dict] = {}

# Interruption notices: re-kick notices stored but never processed (worker or broker was down).
BEAT_SCHEDULE["fleet.sweep_notices"] = {"task": "fleet.sweep_notices", "schedule": 5.0}

# Outbound alerts: re-send deliveries whose task was lost (broker down at enqueue, worker died).
BEAT_SCHEDULE["webhooks.sweep_alerts"] = {"task": "webhooks.sweep_alerts", "schedule": 30.0}

# Market prices: pull live spot prices from AWS every 10 minutes and re-price the open billing
# segments they change (billing.tasks). Off unless SPOTPIPE_PULL_SPOT_PRICES is
# set (to anything but 0/false/no), so a fresh clone with no AWS account does not try to call AWS.
if tunable_from_env("SPOTPIPE_PULL_SPOT_PRICES"):
    BEAT_SCHEDULE["market.pull_spot_prices"] = {"task": "market.tasks.pull_spot_prices", "schedule": 600.0}

# Orchestration: declare nodes whose heartbeats stopped dead (a kill must be caught within 3 s:
# heartbeat timeout 2 s + this period), and reconcile every job's capacity with its plan.
BEAT_SCHEDULE["orchestration.detect_dead_agents"] = {"task": "orchestration.detect_dead_agents", "schedule": 0.5}
BEAT_SCHEDULE["orchestration.reconcile_all"] = {"task": "orchestration.reconcile_all", "schedule": 3.0}

# Dashboard: fold new spot prices into the hourly roll-up that long-range price charts read.
BEAT_SCHEDULE["market.refresh_price_rollup"] = {"task": "market.refresh_price_rollup", "schedule": 600.0}

# Billing: alert teams when a job's spend crosses 50 / 80 / 100% of its budget.
BEAT_SCHEDULE["billing.check_budgets"] = {"task": "billing.check_budgets", "schedule": 60.0}

# Planning: jobs submitted with plan.auto and plan.replan are planned again as prices and preemption
# rates move (jobs.replanning.job_replan); prices change at most every few minutes.
BEAT_SCHEDULE["planning.replan_jobs"] = {"task": "planning.replan_jobs", "schedule": float(
    tunable_from_env("SPOTPIPE_REPLAN_PERIOD_S"))}

# Jobs: forward new metrics of jobs submitted with `tracking` to their MLflow / W&B runs.
BEAT_SCHEDULE["jobs.forward_tracking"] = {"task": "jobs.forward_tracking", "schedule": float(
    tunable_from_env("SPOTPIPE_TRACKING_PERIOD_S"))}

# Observability: fold new notices, instances and reconfigurations into the counts /metrics reads, so
# a scrape's cost follows the rows of the last periods rather than the whole history.
BEAT_SCHEDULE["observability.refresh_metrics_rollup"] = {
    "task": "observability.refresh_metrics_rollup",
    "schedule": float(tunable_from_env("SPOTPIPE_METRICS_ROLLUP_PERIOD_S")),
}
