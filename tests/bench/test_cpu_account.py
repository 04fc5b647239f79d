"""bench/_cpu_account.py: reading /proc/<pid>/stat and /proc/stat, summing a component's process
tree (reaped children included), and a window's account; on a fake /proc and on the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench._cpu_account import (
    CLK_TCK,
    CpuWindow,
    Root,
    descendants,
    exited_unreaped,
    machine_ticks,
    parse_stat,
    read_processes,
    tree_ticks,
)

pytestmark = pytest.mark.timeout(60)


def _stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0,
               state: str = "S", session: int = 1) -> str:
    # proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads ...
    return (f"{pid} ({comm}) {state} {ppid} {pid} {session} 0 -1 4194560 100 0 0 0 {utime} {stime} {cutime} "
            f"{cstime} 20 0 1 0 12345 1000000 100 18446744073709551615\n")


def _fake_proc(root: Path, procs: list[tuple], cpu: tuple[int, ...] = (100, 0, 50, 800, 50, 0, 0, 0)) -> None:
    for entry in root.iterdir() if root.exists() else []:
        if entry.name.isdigit():
            (entry / "stat").unlink()
            entry.rmdir()
    root.mkdir(exist_ok=True)
    for pid, *rest in procs:
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(_stat_line(pid, *rest))
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")


def test_parse_stat_reads_fields_after_a_name_with_spaces_and_parentheses() -> None:
    stat = parse_stat(42, _stat_line(42, "odd) name (x", 7, utime=30, stime=12, cutime=5, cstime=3, session=9))
    assert (stat.pid, stat.ppid, stat.comm, stat.state, stat.session) == (42, 7, "odd) name (x", "S", 9)
    assert (stat.own_ticks, stat.reaped_children_ticks) == (42, 8)


def test_tree_sums_descendants_and_their_reaped_children_but_not_others(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, [
        (1, "init", 0, 1000, 1000, 5000, 5000),
        (10, "python", 1, 100, 20, 7, 3),  # a server master: its reaped workers are in cutime+cstime
        (11, "python", 10, 300, 50),  # worker
        (12, "python", 10, 200, 40),  # worker
        (13, "python", 11, 5, 5),  # a worker's child
        (20, "postgres", 1, 60, 40),  # another tree
    ])
    procs = read_processes(proc)
    assert set(procs) == {1, 10, 11, 12, 13, 20}
    assert descendants(procs, 10) == {10, 11, 12, 13}
    assert tree_ticks(procs, Root(10)) == 120 + 10 + 350 + 240 + 10
    assert tree_ticks(procs, Root(10, children=False)) == 120
    assert tree_ticks(procs, Root(20)) == 100
    assert tree_ticks(procs, Root(None)) == tree_ticks(procs, Root(999)) == 0
    assert machine_ticks(proc) == (150, 850)


def test_window_keeps_a_worker_reaped_within_it_and_counts_a_late_component_from_zero(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    now = iter([0.0, 2.0])
    window = CpuWindow(cores=2, proc=proc, clock=lambda: next(now))
    _fake_proc(proc, [(10, "granian", 1, 100, 0), (11, "granian", 10, 300, 0), (30, "bench", 1, 50, 0)],
               cpu=(1000, 0, 0, 1000, 0, 0, 0, 0))
    window.begin({"web": Root(10), "agents": Root(30, children=False), "load": Root(None)})
    # Within the window: worker 11 ran 100 more ticks and was reaped (into 10's cutime); worker 12
    # started and ran 60; the bench ran 20 and reaped its own child (not the agents' time); the load
    # generator started and ran 80. The machine: 300 ticks busy, 100 idle over 2 s.
    _fake_proc(proc, [(10, "granian", 1, 140, 0, 400, 0), (12, "granian", 10, 60, 0),
                      (30, "bench", 1, 70, 0, 999, 0), (31, "python", 30, 80, 0)],
               cpu=(1300, 0, 0, 1100, 0, 0, 0, 0))
    out = window.end({"web": Root(10), "agents": Root(30, children=False), "load": Root(31)})
    tick = 1 / CLK_TCK
    assert out["window_s"] == 2.0
    assert out["web_cpu_s"] == pytest.approx(200 * tick, abs=0.01)  # 40 + 100 + 60
    assert out["agents_cpu_s"] == pytest.approx(20 * tick, abs=0.01)
    assert out["load_cpu_s"] == pytest.approx(80 * tick, abs=0.01)
    assert out["web_cores"] == pytest.approx(100 * tick, abs=0.001)
    assert out["components_total_cpu_s"] == pytest.approx(300 * tick, abs=0.01)
    assert out["machine_busy_cores"] == pytest.approx(150 * tick, abs=0.001)
    assert out["machine_idle_cores"] == pytest.approx(50 * tick, abs=0.001)
    assert out["machine_idle_share"] == 0.25
    assert out["other_processes_cores"] == pytest.approx(0.0, abs=0.001)
    assert out["cores"] == 2


def test_window_needs_begin(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        CpuWindow(proc=tmp_path).end({})


def test_real_proc_a_child_exited_and_unreaped_keeps_its_cpu() -> None:
    burn = "import time\nwhile time.process_time() < 0.3: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        assert Root(os.getpid()).pid in read_processes()
        deadline = time.monotonic() + 30
        while not exited_unreaped(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        procs = read_processes()
        assert procs[child.pid].state == "Z"
        assert tree_ticks(procs, Root(child.pid)) / CLK_TCK >= 0.25
        # Before reaping it is in this process's tree, not in this process's own time.
        assert tree_ticks(procs, Root(os.getpid())) - tree_ticks(procs, Root(os.getpid(), children=False)) \
            >= procs[child.pid].own_ticks
    finally:
        child.wait()
