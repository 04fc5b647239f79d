"""Fault-tolerance strategies, one module each, one interface (`base.Strategy`)."""

from __future__ import annotations

from runtime.config import JobConfig, LayoutError
from runtime.parallel.layout import Layout
from runtime.strategies.bamboo import BambooStrategy
from runtime.strategies.base import Strategy, full_slots
from runtime.strategies.checkpoint import CheckpointStrategy
from runtime.strategies.none import NoneStrategy
from runtime.strategies.oobleck import OobleckStrategy
from runtime.strategies.recycle import RecycleStrategy

_STRATEGIES: dict[str, type] = {
    cls.name: cls for cls in (NoneStrategy, CheckpointStrategy, BambooStrategy, RecycleStrategy, OobleckStrategy)
}


def get_strategy(name: str) -> Strategy:
    """The strategy object for a config's `strategy` name."""
    if name not in _STRATEGIES:
        raise LayoutError(f"strategy {name!r} is unknown; expected one of {sorted(_STRATEGIES)}")
    return _STRATEGIES[name]()


def initial_layout(config: JobConfig) -> Layout:
    """The failure-free layout of a job under its strategy (validated before anything starts)."""
    config.validate()
    return get_strategy(config.strategy).layout_for(config, full_slots(config))
