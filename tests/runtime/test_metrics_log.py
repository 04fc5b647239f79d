"""The metrics log is read while workers append to it, and a stopped or killed writer can leave half a line."""

from pathlib import Path

from runtime.train.launcher import _max_committed
from runtime.train.metrics_log import read_records


def test_a_torn_last_line_is_skipped_and_complete_records_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics-1.jsonl"
    path.write_text('{"node": 1, "step": 4, "step_time_s": 0.1}\n{"node": 1, "step": 5, "step_time_s": 0.1, "stage_')
    assert read_records(path) == [{"node": 1, "step": 4, "step_time_s": 0.1}]
    assert _max_committed(tmp_path) == 5  # step 4 committed; the torn step-5 record does not count yet


def test_a_missing_or_empty_log_has_no_records(tmp_path: Path) -> None:
    assert read_records(tmp_path / "metrics-9.jsonl") == []
    (tmp_path / "metrics-2.jsonl").write_text("")
    assert read_records(tmp_path / "metrics-2.jsonl") == []
    assert _max_committed(tmp_path) == -1
