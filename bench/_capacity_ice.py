"""The capacity-error section of `python -m bench capacity`: real local nodes, the control plane's
acquisition services in this process, on whatever database Django is set up with (the bench's
scratch SQLite file, or the test database under pytest).

One trial:

1. baseline: a fresh job of `nodes` nodes over the three priced local pools (0.10 < 0.20 < 0.30
   USD/h), launched by `acquisition_launch` on a provider with no capacity script: its nodes start
   in the cheapest pool, `local.node@local`;
2. failover: a fresh job the same way, on a provider whose capacity script answers
   InsufficientInstanceCapacity for `local.node@local` at every moment: the first round fails, the
   offering is marked, and the same launch goes on in `local.node@local-b`;
3. while that mark is live, `other_jobs` one-node jobs of another team are launched (they must not
   ask the marked offering);
4. every node of the trial is terminated and both providers are checked to have no process left;
5. the marks are read from the database (kept, for the check below) and ended (`until` = now, as
   the 180 s TTL would end them), so that the next trial's job meets the error afresh.

Times (`time.perf_counter`, taken in this process around the provider's calls):

- `ice_to_launched_s`: from the moment `InsufficientCapacity` left the provider's launch call (the
  control plane has the error in hand) to the moment `acquisition_launch` has returned (the
  acquisition attached and committed) *and* every node's metadata endpoint answered an IMDSv2
  token + instance-id request with its own id. The failed round's own stamp (`failed_pools[].at`,
  written after the mark) is later than the error; the time from it is `round_stamp_to_launched_s`.
- `baseline_launch_s`: from the start of the (only) provider launch call to the same end point, so
  both figures cover a provider call, the attach and the check, and their difference is what the
  failover adds (the mark, the round's record, re-reading the marks; the failed call itself is not
  counted: on the local provider it is a log line and a script lookup, `failed_call_s`).

`launches_into_unavailable`: every launch call the providers logged in `<root>/launches.jsonl`
(not `adopted`) whose pool had a no-capacity mark with `marked_at <= at < until` (the mark's
`until` as it was in force: the database's, or the moment the bench ended it).
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

CHEAP_ZONE, NEXT_ZONE, DEAR_ZONE = "local", "local-b", "local-c"
POOL_PRICES = ((CHEAP_ZONE, "0.10"), (NEXT_ZONE, "0.20"), (DEAR_ZONE, "0.30"))
LOCAL_TYPE = "local.node"
CHEAP_POOL = f"{LOCAL_TYPE}@{CHEAP_ZONE}"
NEXT_POOL = f"{LOCAL_TYPE}@{NEXT_ZONE}"
ICE = "InsufficientInstanceCapacity"
UNSERVED_CONTROL_PLANE = "http://127.0.0.1:9"
"""Where the nodes' agents try to enrol: nothing listens there (they retry until terminated)."""
JOB_CONFIG = {"model": {"kind": "gpt", "n_layer": 4, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 128},
              "global_batch": 16}

_names = itertools.count(1)


@dataclass
class Call:
    """One provider launch call, as this process saw it."""

    token: str
    pool: str
    started: float  # perf_counter
    ended: float = 0.0
    ended_wall: float = 0.0
    error: str = ""


class TimedProvider:
    """The local provider, with each launch call's start and end (and capacity error) noted."""

    kind = "local"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    def launch(self, request: Any) -> Any:
        from controlplane.orchestration.providers.base import InsufficientCapacity

        call = Call(token=request.client_token, pool=request.pools[0].key if request.pools else "",
                    started=time.perf_counter())
        self.calls.append(call)
        try:
            return self.inner.launch(request)
        except InsufficientCapacity as exc:
            call.error = exc.code or "InsufficientCapacity"
            raise
        finally:
            call.ended, call.ended_wall = time.perf_counter(), time.time()

    def describe(self, ids: Any) -> Any:
        return self.inner.describe(ids)

    def terminate(self, ids: Any) -> None:
        self.inner.terminate(ids)


def price_pools() -> None:
    """Spot prices for the three local pools, so the plan ranks them cheapest first."""
    from django.utils import timezone

    from controlplane.market.models import SpotPrice
    from controlplane.orchestration.services.catalogue import _instance_type_row, _zone_row

    itype = _instance_type_row("local", LOCAL_TYPE)
    now = timezone.now()
    for zone, price in POOL_PRICES:
        SpotPrice.objects.get_or_create(instance_type=itype, zone=_zone_row("local", zone), timestamp=now,
                                        defaults={"price": Decimal(price)})


def submit_job(team: Any, *, nodes: int) -> Any:
    """A pending job of `nodes` local nodes over the three pools (as tests/orchestration's)."""
    from controlplane.jobs.services import job_submit

    return job_submit(team=team, user=None, config=dict(JOB_CONFIG), model_spec=None,
                      plan={"dp": nodes, "pp": 1, "provider": "local", "microbatches": max(1, 4 // nodes),
                            "zones": [DEAR_ZONE, NEXT_ZONE, CHEAP_ZONE]},
                      name=f"capacity-bench-{next(_names)}", strategy="recycle", target_steps=10,
                      budget_usd=Decimal("10.00"), allow_over_budget=True)


def metadata_serves(url: str, node_id: str, timeout_s: float = 5.0) -> bool:
    """The node's metadata endpoint answers an IMDSv2 token request and its instance id."""
    put = urllib.request.Request(url + "/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with urllib.request.urlopen(put, timeout=timeout_s) as response:
        token = response.read().decode()
    get = urllib.request.Request(url + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(get, timeout=timeout_s) as response:
        return response.read().decode() == node_id


def _epoch(at: datetime) -> float:
    return at.timestamp()


@dataclass
class IceRun:
    """The trials' state: two providers (one with the capacity script), the teams, the marks seen."""

    root: Path
    nodes: int = 2
    other_jobs: int = 2
    marks: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from controlplane.accounts.models import Team
        from controlplane.orchestration.providers.local.provider import LocalProvider

        self.root.mkdir(parents=True, exist_ok=True)
        script = self.root / "capacity-script.json"
        # The cheapest pool has no capacity from the epoch on, for longer than any run.
        script.write_text(json.dumps([{"pool": CHEAP_POOL, "from_s": 0, "to_s": 10**9, "error": ICE}]))
        self.plain = LocalProvider(self.root / "baseline", start_timeout_s=30)
        self.scripted = LocalProvider(self.root / "failover", start_timeout_s=30, capacity_script=script)
        self.team, _ = Team.objects.get_or_create(slug="capacity-bench", defaults={"name": "Capacity bench"})
        self.other_team, _ = Team.objects.get_or_create(slug="capacity-bench-other",
                                                        defaults={"name": "Capacity bench (other)"})
        price_pools()

    # --- one launch ---------------------------------------------------------------------------------
    def _launch(self, provider: Any, team: Any, nodes: int) -> dict[str, Any]:
        """Submit a job, request and launch its capacity with `provider`; return the calls, the
        acquisition and when its nodes were attached and serving."""
        from controlplane.fleet.models import Instance
        from controlplane.orchestration import services
        from controlplane.orchestration.providers import set_provider

        timed = TimedProvider(provider)
        set_provider("local", timed)
        try:
            job = submit_job(team, nodes=nodes)
            acquisition = services.capacity_request(job=job)
            if acquisition is None:
                raise RuntimeError(f"job {job.pk}: no acquisition requested (every pool marked?)")
            services.acquisition_launch(acquisition=acquisition)
            acquisition.refresh_from_db()
            instances = list(Instance.objects.filter(job=job).select_related("zone"))
            infos = {n.provider_instance_id: n for n in provider.describe([i.provider_instance_id for i in instances
                                                                          if i.provider_instance_id])}
            serving = all(i.provider_instance_id in infos
                          and metadata_serves(infos[i.provider_instance_id].address, i.provider_instance_id)
                          for i in instances)
            done = time.perf_counter()
        finally:
            set_provider("local", None)
        return {"calls": timed.calls, "done": done, "acquisition": acquisition, "serving": serving,
                "zones": sorted({i.zone.code if i.zone else "" for i in instances}),
                "ids": [i.provider_instance_id for i in instances if i.provider_instance_id],
                "attached": sum(1 for i in instances if i.provider_instance_id and i.state == "pending")}

    # --- one trial -----------------------------------------------------------------------------------
    def trial(self) -> dict[str, Any]:
        base = self._launch(self.plain, self.team, self.nodes)
        # Its nodes end before the failover launch, so the two measured launches meet the same load.
        self.plain.terminate(base["ids"])
        ice = self._launch(self.scripted, self.team, self.nodes)
        failed = [c for c in ice["calls"] if c.error]
        ok_calls = [c for c in ice["calls"] if not c.error]
        rounds = ice["acquisition"].failed_pools or []
        others = [self._launch(self.scripted, self.other_team, 1) for _ in range(self.other_jobs)]
        self.scripted.terminate(ice["ids"] + [i for o in others for i in o["ids"]])
        left = self.plain.live_pids() + self.scripted.live_pids()
        self._end_marks()
        row: dict[str, Any] = {
            "baseline_launch_s": base["done"] - base["calls"][0].started,
            "baseline_zones": base["zones"],
            "baseline_ok": (base["zones"] == [CHEAP_ZONE] and base["attached"] == self.nodes and base["serving"]
                            and len(base["calls"]) == 1),
            "ice_to_launched_s": ice["done"] - failed[0].ended if failed else None,
            "round_stamp_to_launched_s": (ice["done"] - failed[0].ended
                                          + failed[0].ended_wall - datetime.fromisoformat(rounds[0]["at"]).timestamp()
                                          ) if failed and rounds else None,
            "error_to_next_call_s": ok_calls[0].started - failed[0].ended if failed and ok_calls else None,
            "failed_call_s": failed[0].ended - failed[0].started if failed else None,
            # The provider calls that started nodes, alone (the rest is the attach and the check).
            "baseline_call_s": base["calls"][-1].ended - base["calls"][-1].started,
            "next_pool_call_s": ok_calls[0].ended - ok_calls[0].started if ok_calls else None,
            "failover_zones": ice["zones"],
            "failover_ok": (bool(failed) and failed[0].pool == CHEAP_POOL and [c.pool for c in ok_calls] == [NEXT_POOL]
                            and ice["zones"] == [NEXT_ZONE] and ice["attached"] == self.nodes and ice["serving"]
                            and len(rounds) == 1 and rounds[0]["pools"] == [CHEAP_POOL]),
            "other_jobs_pools": [c.pool for o in others for c in o["calls"]],
            "other_jobs_ok": all(o["zones"] == [NEXT_ZONE] and o["serving"] for o in others),
            "pids_left": len(left),
        }
        self.trials.append(row)
        return row

    def _end_marks(self) -> None:
        """Keep every live no-capacity mark as it was in force, then end it now."""
        from django.utils import timezone

        from controlplane.orchestration.models import UnavailableOffering

        now = timezone.now()
        live = list(UnavailableOffering.objects.filter(until__gt=now))
        for mark in live:
            self.marks.append({"pool": f"{mark.instance_type}@{mark.zone or '*'}", "instance_type": mark.instance_type,
                               "capacity_type": mark.capacity_type, "marked_at": _epoch(mark.marked_at),
                               "until": _epoch(min(mark.until, now)), "ttl_until": _epoch(mark.until)})
        UnavailableOffering.objects.filter(pk__in=[m.pk for m in live]).update(until=now)

    # --- the check -----------------------------------------------------------------------------------
    def launches_into_unavailable(self) -> dict[str, Any]:
        """Count the logged launch calls that asked an offering under a live no-capacity mark."""
        self._end_marks()  # marks made since the last trial, if any
        lines = []
        for provider in (self.plain, self.scripted):
            log = provider.root / "launches.jsonl"
            if log.exists():
                lines += [json.loads(text) for text in log.read_text().splitlines() if text.strip()]
        checked = [line for line in lines if not line.get("adopted")]
        bad = []
        during_marks = 0
        for line in checked:
            itype = line["pool"].split("@", 1)[0]
            live = [m for m in self.marks if m["marked_at"] <= line["at"] < m["until"]
                    and m["capacity_type"] == line.get("capacity_type", "spot")]
            during_marks += bool(live)
            if any(m["pool"] in (line["pool"], f"{itype}@*") for m in live):
                bad.append(line)
        return {"count": len(bad), "launches_checked": len(checked), "launches_during_a_mark": during_marks,
                "adopted_skipped": len(lines) - len(checked), "marks": len(self.marks), "examples": bad[:5]}

    def close(self) -> list[int]:
        """Terminate whatever node is left; the pids still alive after (none, when all is well)."""
        for provider in (self.plain, self.scripted):
            provider.terminate(provider.all_node_ids())
        return self.plain.live_pids() + self.scripted.live_pids()
