"""The team's spend report downloads of the team page (issue 21): billing's `team_spend_report`
exactly as the API serves it (`GET /api/v1/teams/{id}/spend/`), as CSV or JSON. Every member of the
team may download it; another team answers 404. The window is UTC days, both ends included, by
default this month so far (`?start=YYYY-MM-DD&end=YYYY-MM-DD` choose another)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone

from controlplane.accounts.models import Team
from controlplane.billing.reports import TeamSpendReport, spend_window_problem, team_spend_report
from frontend.access import data_endpoint, visible_team_ids


class SpendWindowForm(forms.Form):
    """`start` and `end` days; `end` defaults to today (UTC), `start` to the first day of `end`'s month."""

    start = forms.DateField(required=False, input_formats=["%Y-%m-%d"])
    end = forms.DateField(required=False, input_formats=["%Y-%m-%d"])

    def clean(self) -> dict:
        data = super().clean()
        if self.errors:
            return data
        end: date = data.get("end") or timezone.now().date()
        start: date = data.get("start") or end.replace(day=1)
        problem = spend_window_problem(start, end)
        if problem:
            self.add_error("end", problem)
        return {"start": start, "end": end}


def month_so_far() -> tuple[date, date]:
    """The default window, as the team page's links describe it."""
    form = SpendWindowForm({})
    form.is_valid()
    return form.cleaned_data["start"], form.cleaned_data["end"]


def _report(request: HttpRequest, slug: str) -> tuple[TeamSpendReport, str] | JsonResponse:
    team = get_object_or_404(Team, slug=slug, pk__in=visible_team_ids(request))
    form = SpendWindowForm(request.GET)
    if not form.is_valid():
        field, problems = next(iter(form.errors.items()))
        return JsonResponse({"detail": f"{field}: {problems[0]}", "errors": form.errors}, status=400)
    first, last = form.cleaned_data["start"], form.cleaned_data["end"]
    start = datetime.combine(first, time.min, tzinfo=UTC)
    # The midnight after the last day, which spend_window_problem keeps before date.max.
    end = datetime.combine(last, time.min, tzinfo=UTC) + timedelta(days=1)
    return team_spend_report(team=team, start=start, end=end), f"team-{team.slug}-spend-{first}-{last}"


@data_endpoint
def team_spend_csv(request: HttpRequest, slug: str) -> HttpResponse:
    result = _report(request, slug)
    if isinstance(result, HttpResponse):
        return result
    report, name = result
    response = HttpResponse(report.to_csv(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    return response


@data_endpoint
def team_spend_json(request: HttpRequest, slug: str) -> HttpResponse:
    result = _report(request, slug)
    if isinstance(result, HttpResponse):
        return result
    report, name = result
    response = JsonResponse(report.to_dict(), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="{name}.json"'
    return response
