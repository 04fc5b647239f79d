"""The prepare step on the fleet's nodes (`config.data.prepare`; the shares' rules are
`controlplane.jobs.prepare_step`'s): no generation starts while it runs; each of the job's running
nodes, told `prepare`, asks for a share (`share_claim`), prepares it in the job's environment and
reports it (`share_report`); after the last share the job trains on `shards:` of the prepared
corpus. Bad data fails the job once with the node's message (`prepare_failed_report`): every node
would fail the same way."""

from __future__ import annotations

from django.db import transaction

from controlplane.common.errors import Conflict
from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import ACTIVE_JOB_STATUSES, EndReason, TrainingJob
from controlplane.jobs.prepare_step import (
    ShareClaim,
    ShareReport,
    claim_share,
    finish_share,
    may_claim,
    prepare_location,
    step_outcome,
    train_on_prepared,
)
from controlplane.jobs.services import job_record_event
from controlplane.orchestration.services.generations import job_grow
from controlplane.orchestration.services.job_end import job_fail
from controlplane.orchestration.services.transitions import _lock_job
from controlplane.planning.plans import JobPlan


def _serving(instance: Instance) -> TrainingJob:
    """`instance`'s job, locked; `Conflict` when the node serves none or no longer runs."""
    if instance.job is None or instance.state != InstanceState.RUNNING:
        raise Conflict(f"instance {instance.pk} runs no job", field="share")
    return _lock_job(instance.job)


def _live(job: TrainingJob) -> set[int]:
    return set(Instance.objects.filter(job=job, state=InstanceState.RUNNING).values_list("pk", flat=True))


def share_claim(*, instance: Instance) -> ShareClaim:
    """The share of its job's prepare step `instance` prepares next, or why none (`ShareClaim`). A
    node that can only be told to wait is told so without taking the job's lock (`may_claim`)."""
    job = instance.job
    if job is not None and instance.state == InstanceState.RUNNING \
            and not may_claim(job=job, instance_id=instance.pk, live=_live(job)):
        return ShareClaim(state="waiting", out=prepare_location(job))
    with transaction.atomic():
        job = _serving(instance)
        if job.status not in ACTIVE_JOB_STATUSES:
            return ShareClaim(state="stopped")
        live = _live(job)
        claim = claim_share(job=job, instance_id=instance.pk, live=live, shares=JobPlan.from_dict(job.plan).nodes)
        if claim.fresh:
            job_record_event(job=job, kind="prepare_share_claimed",
                             message=f"instance {instance.pk} prepares share {claim.number}/{claim.of} of "
                                     f"{claim.source} into {claim.out}"[:300],
                             data={"instance": instance.pk, "share": claim.number, "of": claim.of})
    return claim


def share_report(*, instance: Instance, report: ShareReport) -> TrainingJob:
    """Record the share `instance` prepared; after the step's last share the job trains on the
    prepared corpus (and its first generation starts once its nodes run), or fails when no share
    wrote the index. `Conflict`: the share is another node's now, or the step is over."""
    with transaction.atomic():
        job = _serving(instance)
        recorded = finish_share(job=job, instance_id=instance.pk, report=report)
        if recorded == "again":
            return job
        job_record_event(job=job, kind="prepare_share_done",
                         message=(f"instance {instance.pk} prepared share {report.number}/{report.of}: "
                                  f"{report.files} files, {report.input_bytes:,} bytes in {report.seconds:.1f} s"
                                  + (" and wrote the index" if report.index_written else ""))[:300],
                         data={"instance": instance.pk, "share": report.number, "of": report.of,
                               "files": report.files, "input_bytes": report.input_bytes,
                               "seconds": report.seconds, "index_written": report.index_written})
        if recorded != "last":
            return job
        outcome = step_outcome(job)
        if not outcome["index_written"]:
            job_fail(job=job, end_reason=EndReason.CONFIG_ERROR, data=outcome,
                     reason=(f"every share of the prepare step ended but none wrote "
                             f"{outcome['out'].rstrip('/')}/index.json: a share's files changed or went missing "
                             "while the others ran")[:300])
            return job
        train_on_prepared(job)
        job_record_event(job=job, kind="prepared",
                         message=(f"prepared {outcome['source']} into {outcome['out']} on {outcome['shares']} "
                                  f"share(s): {outcome['files']} files, {outcome['input_bytes']:,} bytes; "
                                  f"training on shards:{outcome['out']}")[:300],
                         data=outcome)
    job_grow(job=job)
    return job


def prepare_failed_report(*, instance: Instance, reason: str) -> bool:
    """A node could not prepare its share (the source, tokenizer or location is wrong or cannot be
    reached): the job fails with the reason. True when it was failed (False: it had ended, or has
    no prepare step running)."""
    if instance.job is None or not prepare_location(instance.job):
        return False
    return job_fail(job=instance.job, reason=f"the data could not be prepared: {reason or 'no reason given'}"[:300],
                    end_reason=EndReason.CONFIG_ERROR, data={"instance": instance.pk})
