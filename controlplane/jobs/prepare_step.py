"""A job's prepare step: a job submitted with `config.data.prepare` (a folder or `s3://` location)
first tokenizes its source there once, its nodes each taking a share of the source's files
(`runtime.data.prepare_share`, the same cut as `spotpipe data prepare --share K/N`), and then trains
on `shards:` of it. These functions own the step's rows (`PrepareShare`) and the contract's change
when it ends; `orchestration.services.prepare` calls them with the job locked and says which nodes
still serve the job.

A share a lost node held goes back to whichever node asks next; a node that ends its share asks
again, so a job prepares even when fewer nodes than shares come (a share is resumed file by file).
The share that finds every other share's files done writes the index; once every share is done and
one of them wrote it, the job's `data.source` becomes `shards:<location>` and the step is over."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from django.db.models import Sum
from django.utils import timezone

from controlplane.common.errors import Conflict, DomainError
from controlplane.jobs.models import PrepareShare, PrepareShareState, TrainingJob
from runtime.config import DataSpec


def prepare_location(job: TrainingJob) -> str:
    """Where `job` prepares its source before training ("" once prepared, or without a step): the one
    rule for whether a job is in its prepare step."""
    return (job.config.get("data") or {}).get("prepare") or ""


@dataclass(frozen=True, slots=True)
class ShareClaim:
    """The answer to a node that asks for a share: `number` of `of` to prepare, or none and why
    (`waiting`: every share is taken or done and not all are done; `prepared`: the step is over)."""

    state: str
    number: int | None = None
    of: int | None = None
    source: str = ""
    tokenizer: str = ""
    out: str = ""
    fresh: bool = False
    """The node took the share just now (not one it held already)."""

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "share": self.number, "of": self.of, "source": self.source,
                "tokenizer": self.tokenizer, "out": self.out}


def may_claim(*, job: TrainingJob, instance_id: int, live: Collection[int]) -> bool:
    """Whether `claim_share` could give `instance_id` a share or end its wait, read without locks: at
    the end of a large step most nodes wait, and their polls need not queue on the job's lock."""
    if not prepare_location(job):
        return True
    rows = list(PrepareShare.objects.filter(job=job).values_list("state", "instance_id"))
    return not rows or any(state == PrepareShareState.PENDING or (state == PrepareShareState.RUNNING and (
        holder == instance_id or holder not in live)) for state, holder in rows)


def claim_share(*, job: TrainingJob, instance_id: int, live: Collection[int], shares: int) -> ShareClaim:
    """The share `instance_id` prepares next (the caller holds the job lock): the one it holds
    already, else the lowest share nobody holds or whose node is no longer in `live`. The step's
    `shares` rows are made on the first claim."""
    out = prepare_location(job)
    if not out:
        return ShareClaim(state="prepared")
    rows = list(PrepareShare.objects.select_for_update().filter(job=job).order_by("number"))
    if not rows:
        rows = PrepareShare.objects.bulk_create(
            [PrepareShare(job=job, number=k, of=shares) for k in range(max(1, shares))])
    held = next((r for r in rows if r.state == PrepareShareState.RUNNING and r.instance_id == instance_id), None)
    free = held or next((r for r in rows if r.state == PrepareShareState.PENDING
                         or (r.state == PrepareShareState.RUNNING and r.instance_id not in live)), None)
    if free is None:
        return ShareClaim(state="waiting", out=out)
    if free is not held:
        free.state, free.instance_id, free.attempts = PrepareShareState.RUNNING, instance_id, free.attempts + 1
        free.save(update_fields=["state", "instance_id", "attempts"])
    data = job.config["data"]
    return ShareClaim(state="assigned", number=free.number, of=free.of, source=data["source"],
                      tokenizer=data["tokenizer"], out=out, fresh=free is not held)


@dataclass(frozen=True, slots=True)
class ShareReport:
    """What a node's share did (`runtime.data.prepare_share`'s line)."""

    number: int
    of: int
    index_written: bool
    files: int = 0
    input_bytes: int = 0
    seconds: float = 0.0


def finish_share(*, job: TrainingJob, instance_id: int,
                 report: ShareReport) -> Literal["again", "recorded", "last"]:
    """Record `report` of the share `instance_id` holds (the caller holds the job lock): `last` when
    it was the step's last share to end, `again` for a report recorded before. A share the node does
    not hold is a `Conflict` (it went to another node after this one was taken for lost); one outside
    the step's is a `DomainError`."""
    if not prepare_location(job):
        raise Conflict(f"job {job.pk} has no prepare step running", field="share")
    row = PrepareShare.objects.select_for_update().filter(job=job, number=report.number).first()
    if row is None or row.of != report.of:
        total = PrepareShare.objects.filter(job=job).values_list("of", flat=True).first()
        raise DomainError(f"share {report.number}/{report.of} is not one of the step's "
                          f"{total if total is not None else 'unclaimed'} shares", field="share")
    if row.state == PrepareShareState.DONE and row.instance_id == instance_id:
        return "again"  # the agent retried a report that was recorded: once is enough
    if row.state != PrepareShareState.RUNNING or row.instance_id != instance_id:
        raise Conflict(f"share {report.number}/{report.of} is held by another node now", field="share")
    row.state, row.index_written = PrepareShareState.DONE, report.index_written
    row.files, row.input_bytes, row.seconds = report.files, report.input_bytes, report.seconds
    row.finished_at = timezone.now()
    row.save(update_fields=["state", "index_written", "files", "input_bytes", "seconds", "finished_at"])
    others = PrepareShare.objects.filter(job=job).exclude(state=PrepareShareState.DONE).exists()
    return "recorded" if others else "last"


def step_outcome(job: TrainingJob) -> dict[str, Any]:
    """The ended step's figures (for its event), and whether any share wrote the index."""
    shares = PrepareShare.objects.filter(job=job)
    totals = shares.aggregate(files=Sum("files"), input_bytes=Sum("input_bytes"), attempts=Sum("attempts"))
    return {"out": prepare_location(job), "source": (job.config.get("data") or {}).get("source", ""),
            "shares": shares.count(), "files": totals["files"] or 0, "input_bytes": totals["input_bytes"] or 0,
            "claims": totals["attempts"] or 0, "index_written": shares.filter(index_written=True).exists()}


def train_on_prepared(job: TrainingJob) -> None:
    """The step is over: the job trains on the prepared corpus (`shards:<location>`) from now on."""
    job.config = {**job.config, "data": dataclasses.asdict(DataSpec(**job.config["data"]).prepared())}
    job.save(update_fields=["config", "updated_at"])


def prepare_progress(job: TrainingJob) -> dict[str, Any] | None:
    """The step's state for the job's page and `spotpipe status`: where, shares done of all
    (None: no step, or it is over)."""
    out = prepare_location(job)
    if not out:
        return None
    states = list(PrepareShare.objects.filter(job=job).values_list("state", flat=True))
    return {"out": out, "shares": len(states), "done": states.count(PrepareShareState.DONE),
            "running": states.count(PrepareShareState.RUNNING)}
