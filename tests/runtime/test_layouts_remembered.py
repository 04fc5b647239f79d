"""`runtime.distributed.membership.layout_of`: the strategy's layout for (config, slots), remembered
for the last few, since a reaction asks for the current generation's layout that the reaction
before it computed. It must answer exactly what `layout_for` answers, for every input."""

from __future__ import annotations

import pytest

from runtime.config import JobConfig, LayoutError, ModelSpec
from runtime.distributed import membership
from runtime.distributed.membership import LAYOUTS_REMEMBERED, layout_of
from runtime.strategies import get_strategy
from runtime.strategies.base import full_slots


def _config(**overrides) -> JobConfig:
    base = {"model": ModelSpec(n_layer=8), "dp": 4, "pp": 4, "microbatches": 4, "global_batch": 16,
            "strategy": "recycle", "schedule": "fiw"}
    return JobConfig(**{**base, **overrides})


def test_the_layout_is_the_strategys_and_asked_again_is_not_computed_again(monkeypatch) -> None:
    config = _config()
    slots = full_slots(config)
    slots[1][2] = None
    first = layout_of(config, slots)
    assert first == get_strategy("recycle").layout_for(config, slots)
    monkeypatch.setattr(type(get_strategy("recycle")), "layout_for",
                        lambda *a: pytest.fail("computed again"))
    assert layout_of(config, [list(row) for row in slots]) is first


def test_another_config_or_other_slots_get_their_own_layout() -> None:
    config = _config()
    slots = full_slots(config)
    slots[0][0] = None
    other_slots = full_slots(config)
    other_slots[3][3] = None
    spill_off = _config(recycle_spill=False)
    for c, s in ((config, slots), (config, other_slots), (spill_off, slots)):
        assert layout_of(c, s) == get_strategy(c.strategy).layout_for(c, s)


def test_a_layout_error_is_raised_every_time_and_few_layouts_are_kept() -> None:
    config = _config(recycle_spill=False)
    slots = full_slots(config)
    for row in slots:
        row[1] = None  # ReCycle as published: no node left for stage 1
    for _ in range(2):
        with pytest.raises(LayoutError):
            layout_of(config, slots)
    for p in range(4):
        for s in range(4):
            holed = full_slots(_config())
            holed[p][s] = None
            layout_of(_config(), holed)
    assert len(membership._layouts) == LAYOUTS_REMEMBERED
