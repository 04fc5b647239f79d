"""The spot_then_on_demand rule, the unreachable-deadline check, and the capacity-policy simulator
(hand-computed costs on tiny traces; the issue's deadline claim on the bundled traces)."""

from __future__ import annotations

import random

import pytest

from bench._capacity_policies import policy_table, table_rows
from runtime.planner.capacity_policy import (
    CAPACITY_POLICIES,
    ON_DEMAND,
    SPOT,
    SPOT_THEN_ON_DEMAND,
    choose_capacity_type,
    deadline_unreachable,
    planned_spot_rate,
)
from runtime.sim.capacity import (
    EAGER_NEXT_REGION,
    FAILOVER,
    SPOT_THEN_ON_DEMAND_FAILOVER,
    Job,
    Market,
    Region,
    simulate_job,
)

H = 3600.0


def choose(**kw):
    args = {"overhead_s": 0.1 * H, "spot_progress_rate": 0.8, "margin_s": 0.0, "spot_available": True} | kw
    return choose_capacity_type(**args)


def test_policy_names():
    assert CAPACITY_POLICIES == ("spot", "spot_then_on_demand", "on_demand")
    assert (SPOT, ON_DEMAND, SPOT_THEN_ON_DEMAND) == ("spot", "on_demand", "spot_then_on_demand")


def test_switches_to_on_demand_when_behind_spot_pace():
    # 5 h of work at 80% pace needs 6.25 h; 5.5 h left.
    choice = choose(work_left_s=5 * H, time_left_s=5.5 * H, current=SPOT)
    assert choice.capacity_type == ON_DEMAND
    assert "behind spot's pace" in choice.reason
    assert choose(work_left_s=5 * H, time_left_s=6.5 * H, current=SPOT).capacity_type == SPOT


def test_safety_net_when_the_pace_allows_spot():
    # Planned at full pace (r = 1) the pace never objects; on-demand must still fit after one more period.
    kw = {"work_left_s": 2 * H, "current": SPOT, "spot_progress_rate": 1.0, "margin_s": 0.05 * H}
    assert choose(time_left_s=2.2 * H, **kw).capacity_type == SPOT  # 2 + 0.1 + 0.05 <= 2.2
    choice = choose(time_left_s=2.1 * H, **kw)
    assert choice.capacity_type == ON_DEMAND and "safety net" in choice.reason
    # Holding no spot node, a spot (re)start costs one more overhead.
    assert choose(time_left_s=2.2 * H, **(kw | {"current": None})).capacity_type == ON_DEMAND


def test_back_to_spot_when_capacity_returns_and_slack_allows():
    kw = {"work_left_s": 2 * H, "current": ON_DEMAND}
    back = choose(time_left_s=5 * H, **kw)  # (2 + 0.2) / 0.8 = 2.75 h needed
    assert back.capacity_type == SPOT and "back to spot" in back.reason
    assert choose(time_left_s=5 * H, spot_available=False, **kw).capacity_type == ON_DEMAND
    assert choose(time_left_s=2.7 * H, **kw).capacity_type == ON_DEMAND
    # Once back (its restart now in the work left), the next decision keeps it there: no flapping.
    assert choose(work_left_s=2.1 * H, time_left_s=2.75 * H, current=SPOT).capacity_type == SPOT


def test_waits_for_spot_while_ahead():
    choice = choose(work_left_s=1 * H, time_left_s=5 * H, current=None, spot_available=False)
    assert choice.capacity_type == SPOT and "waiting" in choice.reason


def test_rule_refuses_bad_inputs():
    with pytest.raises(ValueError, match="spot_progress_rate"):
        choose(work_left_s=H, time_left_s=H, current=None, spot_progress_rate=0)
    with pytest.raises(ValueError, match="current"):
        choose(work_left_s=H, time_left_s=H, current="reserved")


def test_planned_rate_is_never_below_the_jobs_pace():
    assert planned_spot_rate(work_s=6 * H, deadline_s=12 * H, spot_progress_rate=0.3) == pytest.approx(0.5)
    assert planned_spot_rate(work_s=6 * H, deadline_s=12 * H, spot_progress_rate=0.8) == pytest.approx(0.8)
    assert planned_spot_rate(work_s=6 * H, deadline_s=12 * H, spot_progress_rate=None) == pytest.approx(0.5)


def test_unreachable_even_on_demand():
    assert deadline_unreachable(work_left_s=5 * H, time_left_s=5.05 * H, overhead_s=0.1 * H)
    assert not deadline_unreachable(work_left_s=5 * H, time_left_s=5.1 * H, overhead_s=0.1 * H)
    assert not deadline_unreachable(work_left_s=5 * H, time_left_s=5.05 * H, overhead_s=0.0)


def hourly(*regions: tuple[list[int], float], on_demand: float = 4.0) -> Market:
    """A market of hour ticks: per region (nodes available per hour, constant spot price)."""
    return Market(tuple(Region(f"r{k}", tuple(avail), (price,) * len(avail)) for k, (avail, price) in
                        enumerate(regions)), 3600.0, on_demand)


# 2 nodes, 2 h of work, 0.5 h lost per start. Both regions go dry at hour 2 and return at hour 3.
JOB = Job(nodes=2, work_h=2.0, deadline_h=6.0, overhead_h=0.5)
BOTH_DRY = hourly(([2, 2, 0, 2, 2, 2, 2, 2], 1.0), ([2, 2, 0, 2, 2, 2, 2, 2], 2.0))


def test_costs_by_hand():
    # All on-demand: 2 nodes x 2.5 h x $4 = $20.
    od = simulate_job(BOTH_DRY, JOB, ON_DEMAND)
    assert (od.cost_usd, od.on_demand_cost_usd, od.finish_h, od.met) == (pytest.approx(20), 20, 2.5, True)
    # Spot at home: hours 0-1 ($1 x 2 nodes x 2 h: 0.5 h lost, 1.5 h done), dry at 2, at 3 a restart
    # (0.5 h) and the last 0.5 h of work: 1 h x 2 nodes x $1.
    spot = simulate_job(BOTH_DRY, JOB, SPOT)
    assert spot.cost_usd == pytest.approx(6.0)
    assert (spot.finish_h, spot.launches, spot.region_moves, spot.met) == (4.0, 2, 0, True)
    assert spot.cost_vs_on_demand == pytest.approx(0.3)
    # FAILOVER retries the preempted region first (home, $1); EAGER_NEXT_REGION the other ($2).
    failover = simulate_job(BOTH_DRY, JOB, FAILOVER)
    assert (failover.cost_usd, failover.region_moves) == (pytest.approx(6.0), 0)
    eager = simulate_job(BOTH_DRY, JOB, EAGER_NEXT_REGION)
    assert (eager.cost_usd, eager.region_moves, eager.finish_h) == (pytest.approx(4.0 + 2 * 2.0 * 1.0), 1, 4.0)


def test_spot_then_on_demand_moves_region_only_after_its_patience():
    # Home dry from hour 1; the other region has spot throughout. Deadline far: the rule wants spot.
    market = hourly(([2, 0, 0, 0, 0, 0, 0, 0], 1.0), ([2, 2, 2, 2, 2, 2, 2, 2], 2.0))
    job = Job(nodes=2, work_h=2.0, deadline_h=8.0, overhead_h=0.5)
    eager = simulate_job(market, job, SPOT_THEN_ON_DEMAND_FAILOVER, spot_progress_rate=1.0)
    assert (eager.region_moves, eager.on_demand_node_hours) == (1, 0.0)
    # Hour 0 at home (0.5 h lost, 0.5 h done), the move at hour 1: 0.5 h lost, 1.5 h left, done at 3.
    assert eager.finish_h == pytest.approx(3.0)
    # Two hours of patience: it waits (holding nothing, paying nothing) hours 1 and 2, moves at 3.
    patient = simulate_job(market, job, SPOT_THEN_ON_DEMAND_FAILOVER, spot_progress_rate=1.0,
                           region_patience_s=2 * H)
    assert (patient.region_moves, patient.finish_h) == (1, pytest.approx(5.0))
    assert patient.cost_usd == pytest.approx(eager.cost_usd)


def test_spot_then_on_demand_by_hand():
    # Home dry from hour 2 to the end; deadline 4 h, planned at full pace, decisions every hour.
    market = hourly(([2, 2, 0, 0, 0, 0, 0, 0], 1.0))
    job = Job(nodes=2, work_h=2.0, deadline_h=4.0, overhead_h=0.5)
    stod = simulate_job(market, job, SPOT_THEN_ON_DEMAND, spot_progress_rate=1.0)
    # Spot hours 0-1 ($4, 1.5 h done); at 2, 0.5 h of work and 2 h left: on-demand, a 0.5 h restart
    # and 0.5 h of work, 1 h x 2 nodes x $4.
    assert stod.cost_usd == pytest.approx(4 + 8)
    assert (stod.finish_h, stod.met, stod.launches) == (3.0, True, 2)
    assert (stod.spot_node_hours, stod.on_demand_node_hours) == (pytest.approx(4), pytest.approx(2))
    # Spot alone waits past the trace and is finished on on-demand after it: (0.5 + 0.5) h x 2 x $4.
    spot = simulate_job(market, job, SPOT)
    assert spot.beyond_trace and not spot.met
    assert (spot.cost_usd, spot.finish_h) == (pytest.approx(4 + 8), 9.0)


def test_rule_meets_every_deadline_on_demand_meets_on_random_markets():
    rng = random.Random(5)
    checked = 0
    for _ in range(200):
        avail = []
        while len(avail) < 300:
            avail += [rng.choice((0, 1, 3, 4))] * rng.randint(1, 40)
        market = Market((Region("a", tuple(avail[:300]), (1.0,) * 300),), 600.0, 3.0)
        work, overhead = rng.uniform(2, 10), rng.uniform(0.05, 0.5)
        job = Job(nodes=3, work_h=work, overhead_h=overhead, deadline_h=(work + overhead) * rng.uniform(1.0, 2.5))
        if not simulate_job(market, job, ON_DEMAND).met:
            continue
        checked += 1
        out = simulate_job(market, job, SPOT_THEN_ON_DEMAND, spot_progress_rate=rng.uniform(0.2, 1.0))
        assert out.met, (job, out)
    assert checked > 150


def test_bundled_traces_spot_then_on_demand_meets_every_on_demand_deadline():
    table = policy_table(quick=False)
    policies = table["policies"]
    od, stod = policies[ON_DEMAND], policies[SPOT_THEN_ON_DEMAND]
    assert od["deadlines_met"] == od["deadlines_total"] == table["jobs"]["count"]
    assert stod["missed_where_on_demand_met"] == 0
    assert policies[SPOT_THEN_ON_DEMAND_FAILOVER]["missed_where_on_demand_met"] == 0
    assert od["cost_vs_on_demand"] == pytest.approx(1.0)
    # Spot alone misses deadlines on these traces (droughts of hours): the rule is what saves them.
    assert policies[SPOT]["missed_where_on_demand_met"] > 0
    assert stod["cost_vs_on_demand"] < 1.0
    assert [row[0] for row in table_rows(table)] == list(policies)
