"""Trace parsers on the real public traces: the counts the data README quotes."""

from __future__ import annotations

import pytest

from runtime.traces import TraceFormatError, load_bamboo_csv, load_gcp_counts, load_skypilot_json, load_trace


def test_aws_p3_bamboo_trace_counts(shared_data):
    trace = load_bamboo_csv(shared_data / "traces" / "aws-p3.2xlarge-bamboo.csv")
    s = trace.summary()
    assert s["preemptions"] == 167
    assert s["replacements"] == 145
    assert s["max_nodes"] == 32
    assert s["duration_hours"] == pytest.approx(11.4, abs=0.05)
    assert s["preemptions_per_node_hour"] == pytest.approx(0.61, abs=0.01)
    assert s["nodes_per_preemption_event"] == pytest.approx(2.1, abs=0.05)


def test_aws_g4dn_bamboo_trace_counts(shared_data):
    s = load_trace(shared_data / "traces" / "aws-g4dn-bamboo.csv").summary()
    assert s["preemptions"] == 74
    assert s["max_nodes"] == 24
    assert s["duration_hours"] == pytest.approx(10.8, abs=0.05)
    assert s["preemptions_per_node_hour"] == pytest.approx(0.55, abs=0.01)


def test_gcp_counts_trace(shared_data):
    trace = load_gcp_counts(shared_data / "traces" / "gcp-a100-east1b-bamboo.txt")
    s = trace.summary()
    assert s["preemptions"] == 154
    assert s["preemption_events"] == 36
    assert s["duration_hours"] == pytest.approx(27.0, abs=0.05)
    assert s["preemptions_per_node_hour"] == pytest.approx(0.10, abs=0.005)
    counts = [n for _, n in trace.node_count_series()]
    assert min(counts[1:]) == 17
    assert max(counts) == 64


def test_skypilot_ticks_one_means_preempted(shared_data):
    trace = load_skypilot_json(shared_data / "traces" / "aws-v100-1node-us-east-1c-skypilot.json",
                               format="preemption-ticks")
    s = trace.summary()
    assert trace.meta["gap_seconds"] == 32
    assert s["duration_hours"] == pytest.approx(19_961 * 32 / 3600, abs=0.01)
    assert s["preemptions"] == 41  # 41 rises 0 -> 1 (preempted); the trace starts running (0)
    assert s["initial_nodes"] == 1
    flipped = load_skypilot_json(shared_data / "traces" / "aws-v100-1node-us-east-1c-skypilot.json",
                                 format="preemption-ticks", preempted_value=0)
    assert flipped.initial_nodes() == 0


def test_autodetect_and_format_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,node1\n12,jump,node1\n")
    with pytest.raises(TraceFormatError, match=r"bad.csv:2"):
        load_bamboo_csv(bad)
    unknown = tmp_path / "x.txt"
    unknown.write_text("hello world\n")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load_trace(unknown)
    good = tmp_path / "t.csv"
    good.write_text("0,add,a\n0,add,b\n3600000,remove,a\n7200000,add,c\n")
    t = load_trace(good)
    assert (t.preemptions(), t.replacements(), t.initial_nodes()) == (1, 1, 2)
    assert t.node_hours() == pytest.approx(3.0)
