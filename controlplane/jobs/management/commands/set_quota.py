"""`manage.py set_quota TEAM [--max-nodes N] [--max-jobs N] [--monthly-budget USD]`: set a team's
queue limits (the team by slug or id). A limit left out stays as it was; `none` removes one. What
the team then holds and queues is printed."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.jobs.admission import team_quota_set, team_quota_view
from controlplane.jobs.services import parse_budget


def _count(value: str) -> int | None:
    if value.lower() == "none":
        return None
    if not value.isdigit():
        raise CommandError(f"expected a non-negative integer or none, got {value!r}")
    return int(value)


class Command(BaseCommand):
    help = "Set a team's quota: nodes and jobs at once, and its monthly budget."

    def add_arguments(self, parser):
        parser.add_argument("team", help="the team's slug or id")
        parser.add_argument("--max-nodes", help="nodes the team's jobs claim at once (none: no limit)")
        parser.add_argument("--max-jobs", help="jobs admitted at once (none: no limit)")
        parser.add_argument("--monthly-budget", help="USD per calendar month, UTC (none: no limit)")

    def handle(self, *args, **opts):
        team = Team.objects.filter(slug=opts["team"]).first() or (
            Team.objects.filter(pk=int(opts["team"])).first() if opts["team"].isdigit() else None)
        if team is None:
            raise CommandError(f"no team {opts['team']!r}")
        changes = {field: _count(opts[field]) for field in ("max_nodes", "max_jobs") if opts[field] is not None}
        budget = opts["monthly_budget"]
        if budget is not None:
            if budget.lower() == "none":
                changes["monthly_budget_usd"] = None
            else:
                try:
                    Decimal(budget)
                except InvalidOperation:
                    raise CommandError(f"--monthly-budget: not a number: {budget!r}") from None
                value, problems = parse_budget(budget, field="--monthly-budget")
                if problems:
                    raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()))
                changes["monthly_budget_usd"] = value
        try:
            team_quota_set(team_id=team.pk, changes=changes)
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(team_quota_view(team_id=team.pk), indent=2, default=str))
