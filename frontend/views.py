"""Server-rendered shell pages and the job actions (submit, cancel, resume). Pages render their
frame, tables that need no chart, and empty states; charts come from the page's data endpoint."""

from __future__ import annotations

import logging

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.jobs.admission import queue_positions
from controlplane.jobs.artifacts import job_artifacts_location, job_artifacts_summary
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.selectors import job_plan_summary
from controlplane.jobs.services import job_cancel, job_resume, job_submit
from controlplane.jobs.spend import job_spend
from frontend import costs
from frontend.access import job_for_request, visible_team_ids
from frontend.forms import JobSubmitForm

logger = logging.getLogger(__name__)


def _page(request: HttpRequest, template: str, page: str, data_url: str, **context) -> HttpResponse:
    context.update({"page": page, "data_url": data_url})
    return render(request, f"frontend/{template}", context)


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    team_ids = visible_team_ids(request)
    return _page(request, "overview.html", "overview", reverse("frontend:overview-data"),
                 has_jobs=TrainingJob.objects.filter(team_id__in=team_ids).exists(), no_team=not team_ids)


@login_required
def prices(request: HttpRequest) -> HttpResponse:
    return _page(request, "prices.html", "prices", reverse("frontend:prices-data"))


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    return _page(request, "fleet.html", "fleet", reverse("frontend:fleet-data"))


@login_required
def jobs(request: HttpRequest) -> HttpResponse:
    team_ids = visible_team_ids(request)
    return _page(request, "jobs.html", "jobs", reverse("frontend:jobs-data"),
                 has_jobs=TrainingJob.objects.filter(team_id__in=team_ids).exists(), no_team=not team_ids)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_request(request, job_id)
    spent = costs.job_costs_so_far(job_ids=[job.pk]).get(job.pk)
    return _page(request, "job_detail.html", "job", reverse("frontend:job-data", args=[job.pk]), job=job,
                 plan=job_plan_summary(job=job, cost_so_far=spent), artifacts=_artifacts(job),
                 trackers=list(job.trackers.order_by("name")),
                 spend=job_spend(job=job, at=timezone.now()),
                 queue_position=queue_positions(team_id=job.team_id).get(job.pk) if job.status == "queued" else None)


def _artifacts(job: TrainingJob) -> dict:
    """The job's artifacts for its page; an unreachable store (S3) says so instead of failing the page."""
    try:
        return job_artifacts_summary(job=job)
    except Exception as exc:  # boto3/botocore errors, OSError
        logger.warning("artifacts of job %s: %s", job.pk, exc)
        return {"location": job_artifacts_location(job=job), "files": [], "error": str(exc)[:200]}


@login_required
def job_cost(request: HttpRequest, job_id: int) -> HttpResponse:
    """The printable cost report, rendered on the server (it has no live parts)."""
    job = job_for_request(request, job_id)
    return _page(request, "job_cost.html", "cost", reverse("frontend:job-cost-data", args=[job.pk]),
                 job=job, cost=costs.job_cost_page(job=job))


@login_required
def notices(request: HttpRequest) -> HttpResponse:
    return _page(request, "notices.html", "notices", reverse("frontend:notices-data"))


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    """Submit a job through the same service the API uses."""
    teams = Team.objects.filter(pk__in=visible_team_ids(request)).order_by("name")
    form = JobSubmitForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = job_submit(
                team=data["team"], user=request.user, name=data["name"], config=form.config(), plan=form.plan(),
                strategy=data["strategy"], target_steps=data["target_steps"], deadline=data["deadline"],
                budget_usd=data["budget_usd"],
            )
        except ValidationError as error:
            form.add_service_errors(error)
        except DomainError as error:
            form.add_error(error.field if error.field in form.fields else None, error.message)
        else:
            messages.success(request, f"Job {job.name!r} submitted; it will be planned and started shortly.")
            return redirect("frontend:job-detail", job_id=job.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "frontend/job_new.html", {"page": "job-new", "form": form, "no_team": not teams},
                  status=status)


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_request(request, job_id)
    try:
        job_cancel(job=job, user=request.user, reason=request.POST.get("reason", ""))
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Job {job.name!r} cancelled.")
    return redirect("frontend:job-detail", job_id=job.pk)


@login_required
@require_POST
def job_resume_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_request(request, job_id)
    try:
        job_resume(job=job, user=request.user)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Job {job.name!r} resumed; it is pending again.")
    return redirect("frontend:job-detail", job_id=job.pk)
