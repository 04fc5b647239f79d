"""`python -m bench capacity`, reduced: a couple of failover trials with real local nodes on the test
database, the launch check (and that it would catch a launch into a marked offering), and the policy
section's keys. No timing is asserted: only that the trials ran as described and left nothing."""

from __future__ import annotations

import json

import pytest

from bench import capacity
from bench._capacity_ice import CHEAP_POOL, UNSERVED_CONTROL_PLANE, IceRun

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _no_control_plane(settings):
    """The nodes' agents enrol with a closed port and keep retrying; no rendezvous store process."""
    settings.SPOTPIPE_PUBLIC_URL = UNSERVED_CONTROL_PLANE
    settings.SPOTPIPE_RENDEZVOUS = "none"


def test_failover_trials_fail_over_launch_nothing_into_a_marked_offering_and_leave_no_node(tmp_path):
    figures = capacity.ice_section(tmp_path / "nodes", trials=2, nodes=1, other_jobs=1)

    for key in ("ice_to_launched_s", "baseline_launch_s", "round_stamp_to_launched_s"):
        assert set(figures[key]) >= {"p50", "p99", "max", "trials"} and figures[key]["trials"] == 2, key
    assert {"goal_p99_s", "meets_goal", "failover_vs_baseline"} <= set(figures)
    assert figures["trials_as_expected"] == {"baseline_ok": 2, "failover_ok": 2, "other_jobs_ok": 2}
    assert figures["launches_into_unavailable"] == 0
    check = figures["launches_into_unavailable_check"]
    # Per trial: the baseline launch, the failed and the failed-over round, the other job's launch.
    assert check["launches_checked"] == 2 * 4
    assert check["launches_during_a_mark"] == 2 * 2  # not vacuous: two launches a trial ran under the mark
    assert figures["pids_left_after_trials"] == 0 and figures["pids_left_at_end"] == 0


def test_the_launch_check_counts_a_launch_into_a_live_mark(tmp_path):
    run = IceRun(tmp_path / "nodes", nodes=1, other_jobs=0)
    try:
        run.trial()
        assert run.launches_into_unavailable()["count"] == 0
        (mark,) = run.marks
        assert mark["pool"] == CHEAP_POOL
        # A launch call logged while the mark was in force, into its pool: what the check is for.
        with open(run.scripted.root / "launches.jsonl", "a") as log:
            log.write(json.dumps({"at": mark["marked_at"] + 0.001, "pool": CHEAP_POOL, "token": "x", "count": 1,
                                  "capacity_type": "spot", "adopted": False}) + "\n")
        assert run.launches_into_unavailable()["count"] == 1
    finally:
        assert run.close() == []


def test_the_policy_section_reports_every_policys_cost_and_the_goal_for_both_rules():
    out = capacity.policy_section(quick=True, out_dir=None)

    assert {"spot_then_on_demand", "spot_then_on_demand_failover", "on_demand"} <= set(out["policies"])
    for name, policy in out["policies"].items():
        assert {"cost_vs_on_demand", "deadlines_met", "deadlines_total"} <= set(policy), name
    assert {"jobs", "traces", "prices", "goal"} <= set(out["policy_table"])
    for name in ("spot_then_on_demand", "spot_then_on_demand_failover"):
        assert set(out["policy_goal"][name]) == {"meets_every_on_demand_deadline", "cost_vs_on_demand", "cost_ok",
                                                 "meets_goal"}
