"""`python -m bench` states the machine before its figures: what lets two runs' timings be compared.
That every bench's JSON and first line carry it is checked end to end in
tests/runtime/test_bench_training.py."""

from __future__ import annotations

from bench.report import machine_reference


def test_the_machine_reference_is_a_positive_speed_with_cores_and_load():
    machine = machine_reference()
    assert machine["python_loop_ns_per_iteration"] > 0
    assert machine["cores"] >= 1 and machine["load_average_1m"] >= 0

