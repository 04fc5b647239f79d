"""Which capacity type a job's nodes should be, from moment to moment (pure: no Django, no torch).

A job's `capacity` policy is one of `CAPACITY_POLICIES`: `spot` (spot only, waits out droughts),
`on_demand`, or `spot_then_on_demand`, which runs on spot while the deadline allows and on
on-demand when it does not. `choose_capacity_type` is that rule: "Can't Be Late" (Wu et al., NSDI'24)
uniform progress with its safety net. With `w` the work left at full speed, `T` the time left, `r`
the pace planned for spot (`planned_spot_rate`: spot's expected rate, never below the job's own
pace), `d` the overhead of one (re)start or switch and `m` the time until the rule is asked again:

* on spot, or waiting for it: stay while `T >= w / r` (on pace) and `T >= w + d + m` (the safety
  net: after one more period off on-demand, on-demand still finishes after a switch; `+ d` more
  when no spot node runs, for its restart). Otherwise go to on-demand.
* on on-demand: go back to spot when spot has capacity and `T >= (w + 2 d) / r + m` (ahead of the
  pace by a restart on spot and a switch back, so the return is not undone at once). On-demand runs
  at full speed, so a job behind spot's pace catches up there and returns.

The safety net holds whatever `r`: a job that follows the rule every `m` seconds misses no deadline
that on-demand from the start would meet (`w + d <= T`), given an on-demand launch always succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass

SPOT = "spot"
ON_DEMAND = "on_demand"
SPOT_THEN_ON_DEMAND = "spot_then_on_demand"
CAPACITY_TYPES = (SPOT, ON_DEMAND)
"""What a node is; the same spellings as the providers' capacity types."""
CAPACITY_POLICIES = (SPOT, SPOT_THEN_ON_DEMAND, ON_DEMAND)
"""A job's `capacity` field; `spot` is the default."""
DEFAULT_CAPACITY_POLICY = SPOT


@dataclass(frozen=True, slots=True)
class CapacityChoice:
    """The capacity type to hold now, and why (one line for the job's timeline)."""

    capacity_type: str
    reason: str


def choose_capacity_type(
    *,
    work_left_s: float,
    time_left_s: float,
    spot_available: bool,
    current: str | None,
    overhead_s: float,
    spot_progress_rate: float,
    margin_s: float = 0.0,
) -> CapacityChoice:
    """The capacity type a `spot_then_on_demand` job should hold now (see the module doc).

    `work_left_s`: work left at full speed, any restart overhead already under way included.
    `current`: `SPOT` or `ON_DEMAND` when the job's nodes run on that type, None when it holds none
    (waiting for spot, or not started). `spot_progress_rate`: expected seconds of work done per
    second on spot, in (0, 1]. `margin_s`: time until the next decision (a deadline must survive
    one more period of doing nothing useful)."""
    if not 0 < spot_progress_rate <= 1:
        raise ValueError(f"spot_progress_rate={spot_progress_rate} must be in (0, 1]")
    if current not in (SPOT, ON_DEMAND, None):
        raise ValueError(f"current={current!r} must be {SPOT!r}, {ON_DEMAND!r} or None")
    work = max(work_left_s, 0.0)
    rate, d = spot_progress_rate, overhead_s
    if current == ON_DEMAND:
        # Back to spot costs a restart now and, should spot fail, a switch back: be ahead by both.
        need = (work + 2 * d) / rate + margin_s
        if not spot_available:
            return CapacityChoice(ON_DEMAND, "staying on on-demand: no spot capacity")
        if time_left_s >= need:
            return CapacityChoice(SPOT, f"back to spot: {_h(time_left_s)} left, {_h(need)} needed at {rate:.0%} pace")
        return CapacityChoice(ON_DEMAND, f"staying on on-demand: {_h(time_left_s)} left, spot needs {_h(need)}")
    # Pace: spot at `rate` still finishes. Safety net: one more period off on-demand (and a spot
    # restart, when none runs) still leaves on-demand time to finish after a switch.
    restart = 0.0 if current == SPOT else d
    pace = work / rate
    safety = work + restart + d + margin_s
    if time_left_s < max(pace, safety):
        why = "behind spot's pace" if pace > safety else "safety net"
        return CapacityChoice(ON_DEMAND, f"to on-demand ({why}): {_h(time_left_s)} left, "
                                         f"{_h(max(pace, safety))} needed")
    if current == SPOT:
        return CapacityChoice(SPOT, f"staying on spot: {_h(time_left_s)} left, {_h(max(pace, safety))} needed")
    what = "starting on spot" if spot_available else "waiting for spot capacity"
    return CapacityChoice(SPOT, f"{what}: {_h(time_left_s)} left, {_h(max(pace, safety))} needed")


def planned_spot_rate(*, work_s: float, deadline_s: float, spot_progress_rate: float | None) -> float:
    """The `spot_progress_rate` to plan with: spot's expected rate, but never below the job's own
    uniform pace (work / time to the deadline, Can't Be Late's line). Below that pace spot cannot
    finish anyway, and planning at it keeps the job on spot whenever it is on schedule."""
    pace = min(1.0, work_s / deadline_s) if deadline_s > 0 else 1.0
    return max(pace, min(1.0, spot_progress_rate)) if spot_progress_rate is not None else pace


def deadline_unreachable(*, work_left_s: float, time_left_s: float, overhead_s: float) -> bool:
    """Whether even on-demand (always available) cannot finish in time: work left plus one (re)start
    exceeds the time left. Pass `overhead_s=0` for a job already running on on-demand."""
    return work_left_s + overhead_s > time_left_s


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"
