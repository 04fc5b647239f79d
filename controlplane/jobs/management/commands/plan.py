"""`python manage.py plan`: plan a job from the command line (same planner as POST /api/v1/plans/)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.common.errors import DomainError
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.selectors import plan_input_from_job
from controlplane.planning.services import PlanInfeasible, PlanInput, plan_compute
from runtime.config import AUTO_STRATEGY, FAULT_TOLERANT_STRATEGIES, ModelSpec
from spotpipe.tables import print_table


class Command(BaseCommand):
    help = "Plan instance type x nodes x DP x PP for a job under a deadline or a budget."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--job", type=int, help="plan this job (its model, batch, steps, deadline, budget)")
        parser.add_argument("--kind", default="gpt", choices=["gpt", "mlp"])
        parser.add_argument("--n-layer", type=int, default=24)
        parser.add_argument("--n-embd", type=int, default=1024)
        parser.add_argument("--n-head", type=int, default=16)
        parser.add_argument("--seq-len", type=int, default=512)
        parser.add_argument("--vocab-size", type=int, default=8192)
        parser.add_argument("--global-batch", type=int, default=256)
        parser.add_argument("--samples", type=int, default=5_000_000)
        parser.add_argument("--deadline-hours", type=float)
        parser.add_argument("--budget-usd", type=float)
        parser.add_argument("--strategy", default=AUTO_STRATEGY, choices=FAULT_TOLERANT_STRATEGIES)
        parser.add_argument(
            "--instance-type", action="append", dest="instance_types", help="allowed type (repeat); default: GPU types"
        )
        parser.add_argument("--zone", action="append", dest="zones", help="allowed zone (repeat)")
        parser.add_argument("--max-nodes", type=int, default=32)
        parser.add_argument("--top", type=int, default=15, help="alternatives to print")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        types = opts["instance_types"] or ["p3.2xlarge", "g4dn.xlarge", "g5.xlarge", "g6.xlarge"]
        try:
            if opts["job"]:
                job = TrainingJob.objects.filter(pk=opts["job"]).first()
                if job is None:
                    raise CommandError(f"no job {opts['job']}")
                data = plan_input_from_job(
                    job=job,
                    instance_types=types,
                    at=_now(),
                    zones=opts["zones"],
                    deadline_hours=opts["deadline_hours"],
                    budget_usd=opts["budget_usd"],
                    max_nodes=opts["max_nodes"],
                )
            else:
                model = ModelSpec(
                    kind=opts["kind"],
                    n_layer=opts["n_layer"],
                    n_embd=opts["n_embd"],
                    n_head=opts["n_head"],
                    seq_len=opts["seq_len"],
                    vocab_size=opts["vocab_size"],
                )
                data = PlanInput(
                    model=model,
                    global_batch=opts["global_batch"],
                    samples=opts["samples"],
                    instance_types=types,
                    zones=opts["zones"],
                    deadline_hours=opts["deadline_hours"],
                    budget_usd=opts["budget_usd"],
                    strategy=opts["strategy"],
                    max_nodes=opts["max_nodes"],
                )
            plan, _pools = plan_compute(data=data, team_ids=None)
        except PlanInfeasible as exc:
            nearest = exc.nearest
            hint = ""
            if nearest is not None:
                hint = (
                    f"\nnearest feasible plan: {nearest.nodes} x {nearest.instance_type} dp={nearest.dp} "
                    f"pp={nearest.pp} {nearest.schedule}: {nearest.hours:.2f} h, ${nearest.cost_usd:.2f}"
                )
            raise CommandError(f"infeasible ({exc.field}): {exc.message}{hint}") from exc
        except DomainError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from exc
        if opts["json"]:
            self.stdout.write(json.dumps(plan.to_dict(), indent=2, default=str))
            return
        best = plan.best
        self.stdout.write(
            f"best ({plan.objective}): {best.nodes} x {best.instance_type} {best.zone} dp={best.dp} pp={best.pp} "
            f"M={best.microbatches} {best.schedule}: {best.hours:.2f} h, ${best.cost_usd:.2f}, "
            f"{best.samples_per_s:.1f} samples/s, {best.expected_preemptions:.1f} expected preemptions "
            f"({best.risk_source}); searched {plan.considered} candidates in {plan.search_s:.2f} s"
        )
        print_table(
            "alternatives",
            ["type", "zone", "nodes", "dp", "pp", "sched", "hours", "cost $", "preempt.", "risk", "feasible", "model"],
            [
                [
                    c.instance_type,
                    c.zone or "-",
                    c.nodes,
                    c.dp,
                    c.pp,
                    c.schedule,
                    c.hours,
                    c.cost_usd,
                    c.expected_preemptions,
                    c.risk_source,
                    "yes" if c.feasible else c.reason,
                    c.model,
                ]
                for c in plan.alternatives[: opts["top"]]
            ],
        )
        print_table(
            "templates (best layout per node count)",
            ["nodes", "pipelines (nodes: stages)", "samples/s"],
            [
                [
                    t["nodes"],
                    "; ".join(f"{p['nodes']}: {p['stages']}" for p in t["pipelines"]),
                    t["samples_per_s"],
                ]
                for t in plan.templates
            ],
        )


def _now():  # type: ignore[no-untyped-def]
    from django.utils import timezone

    return timezone.now()
