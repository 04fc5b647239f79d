"""Trace formats are named, never guessed: the same JSON tick shape read as counts or as one node."""

from __future__ import annotations

import json

import pytest

from runtime.sim.capacity import bundled_trace_paths
from runtime.traces import (
    AVAILABILITY_COUNT,
    FORMATS,
    PREEMPTION_TICKS,
    TraceFormatError,
    load_skypilot_json,
    load_trace,
)


def _ticks(tmp_path, data, **meta) -> object:
    path = tmp_path / "ticks.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60, **meta}, "data": data}))
    return path


def test_count_trace_read_as_counts(tmp_path):
    path = _ticks(tmp_path, [16] * 30 + [10] * 30 + [0] * 10 + [16] * 50, format=AVAILABILITY_COUNT)
    trace = load_trace(path)
    assert trace.meta["format"] == AVAILABILITY_COUNT
    assert trace.initial_nodes() == 16
    assert trace.preemptions() == 16  # 6 at the dip to 10, then the other 10 at the drought
    assert trace.replacements() == 16
    assert trace.node_hours() == pytest.approx((16 * 30 + 10 * 30 + 16 * 50) / 60)


def test_format_argument_and_top_level_format(tmp_path):
    unnamed = _ticks(tmp_path, [3, 3, 1, 3])
    assert load_trace(unnamed, format=AVAILABILITY_COUNT).initial_nodes() == 3
    top = tmp_path / "top.json"
    top.write_text(json.dumps({"format": AVAILABILITY_COUNT, "metadata": {"gap_seconds": 60}, "data": [4, 2]}))
    assert load_trace(top).initial_nodes() == 4


def test_preemption_ticks_read_as_one_node(tmp_path):
    path = _ticks(tmp_path, [0] * 10 + [1] * 5 + [0] * 10)
    trace = load_trace(path, format=PREEMPTION_TICKS)
    assert (trace.initial_nodes(), trace.max_nodes(), trace.preemptions()) == (1, 1, 1)
    named = _ticks(tmp_path, [0, 1, 0], format=PREEMPTION_TICKS)
    assert load_skypilot_json(named).max_nodes() == 1


def test_unnamed_json_ticks_are_refused(tmp_path):
    path = _ticks(tmp_path, [16, 16, 12, 16])
    for load in (load_trace, load_skypilot_json):
        with pytest.raises(TraceFormatError) as err:
            load(path)
        assert PREEMPTION_TICKS in str(err.value) and AVAILABILITY_COUNT in str(err.value)
        assert "metadata.format" in str(err.value)


def test_conflicting_or_unknown_formats_are_refused(tmp_path):
    path = _ticks(tmp_path, [1, 0], format=PREEMPTION_TICKS)
    with pytest.raises(TraceFormatError, match="the file says format 'preemption-ticks'"):
        load_trace(path, format=AVAILABILITY_COUNT)
    with pytest.raises(TraceFormatError, match="unknown trace format 'counts'"):
        load_trace(path, format="counts")
    odd = _ticks(tmp_path, [1, 0], format="bamboo-csv")
    with pytest.raises(TraceFormatError, match="not a JSON tick format"):
        load_trace(odd)


def test_csv_formats_by_syntax_or_by_name(tmp_path):
    bamboo = tmp_path / "b.csv"
    bamboo.write_text("0,add,a\n0,add,b\n60000,remove,a\n")
    gcp = tmp_path / "g.txt"
    gcp.write_text("2024-01-01, 00:00:00, 5\n2024-01-01, 00:10:00, 2\n")
    for path, name, nodes in ((bamboo, "bamboo-csv", 2), (gcp, "gcp-counts", 5)):
        assert load_trace(path).meta["format"] == name
        assert load_trace(path, format=name).initial_nodes() == nodes
    with pytest.raises(TraceFormatError):
        load_trace(gcp, format="bamboo-csv")
    assert set(FORMATS) == {"bamboo-csv", "gcp-counts", PREEMPTION_TICKS, AVAILABILITY_COUNT}


def test_the_shared_can_t_be_late_trace_is_one_node_when_named(shared_data):
    path = shared_data / "traces" / "aws-v100-1node-us-east-1c-skypilot.json"
    with pytest.raises(TraceFormatError):
        load_trace(path)
    assert load_trace(path, format=PREEMPTION_TICKS).max_nodes() == 1


def test_bundled_traces_load_as_16_node_counts():
    paths = bundled_trace_paths()
    assert len(paths) == 2
    for path in paths:
        assert path.stat().st_size < 300_000
        trace = load_trace(path)  # the file names its format
        s = trace.summary()
        assert trace.meta["format"] == AVAILABILITY_COUNT
        assert (s["initial_nodes"], s["max_nodes"]) == (16, 16)
        assert s["duration_hours"] == pytest.approx(96.0)
        counts = [n for _, n in trace.node_count_series()]
        assert min(counts) < 4, "no capacity drought in the trace"
    regions = [load_trace(p).meta["region"] for p in paths]
    assert regions == ["us-east-1", "us-west-2"]
