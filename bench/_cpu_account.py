"""Where a machine's CPU went during a window, by component: CPU seconds (utime + stime from
/proc/<pid>/stat) summed over each component's process tree, read at the window's start and end.

A component is a root pid. With `children=True` its tree is the root and every live descendant
(by parent pid), each counted with its own time plus cutime + cstime (what it spent on children it
has already waited for), so a worker that exits and is reaped within the window still counts: its
time moves from its own line into its parent's. With `children=False` only the root's own threads
count (the bench's process, whose reaped children are other components). A process that has exited
but is not yet reaped (a zombie) still shows its whole time: end a window on a child before reaping
it (`exited_unreaped`). The machine's busy and idle time come from /proc/stat's first line, so what
no component accounts for shows as "other processes" (other users' sessions on a shared machine)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    comm: str
    state: str
    session: int
    own_ticks: int  # utime + stime (all of the process's threads)
    reaped_children_ticks: int  # cutime + cstime (children it waited for, and theirs)


@dataclass(frozen=True)
class Root:
    """A component: the process tree under `pid` (None: not running at that end of the window)."""

    pid: int | None
    children: bool = True


def parse_stat(pid: int, text: str) -> ProcStat:
    """One /proc/<pid>/stat line. The command name (field 2) is in parentheses and may itself hold
    spaces and ')': the fields after it are split after the last ')'."""
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    # After the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime ... (proc(5) fields 3.., here 0..)
    return ProcStat(pid=pid, ppid=int(fields[1]), comm=head.partition("(")[2], state=fields[0],
                    session=int(fields[3]),
                    own_ticks=int(fields[11]) + int(fields[12]),
                    reaped_children_ticks=int(fields[13]) + int(fields[14]))


def read_processes(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process's stat line now (processes that vanish while being read are left out)."""
    out: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            out[int(entry.name)] = parse_stat(int(entry.name), (entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(procs: Mapping[int, ProcStat], root: int) -> set[int]:
    """`root` and every process under it (by parent pid), among `procs`."""
    children: dict[int, list[int]] = {}
    for stat in procs.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    tree, todo = set(), [root] if root in procs else []
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def tree_ticks(procs: Mapping[int, ProcStat], root: Root) -> int:
    """Clock ticks of CPU of a component (see the module's docstring); 0 when it is not running."""
    if root.pid is None or root.pid not in procs:
        return 0
    if not root.children:
        return procs[root.pid].own_ticks
    return sum(procs[p].own_ticks + procs[p].reaped_children_ticks for p in descendants(procs, root.pid))


def machine_ticks(proc: Path = PROC) -> tuple[int, int]:
    """(busy, idle) clock ticks of all CPUs since boot: /proc/stat's `cpu` line; idle includes iowait,
    busy is user + nice + system + irq + softirq + steal (guest time is already in user)."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:9]]
            return v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v[3] + v[4]
    raise ValueError("no cpu line in /proc/stat")


def exited_unreaped(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it (its /proc entry keeps its CPU time)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None


class CpuWindow:
    """begin() and end() read every component and the machine; end() returns the account.

    A component named at end() but not at begin() started within the window: it counts from 0."""

    def __init__(self, cores: int | None = None, proc: Path = PROC,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores or os.cpu_count() or 1
        self.proc = proc
        self.clock = clock
        self._start: tuple[float, dict[str, int], tuple[int, int]] | None = None

    def _read(self, roots: Mapping[str, Root]) -> tuple[float, dict[str, int], tuple[int, int]]:
        procs = read_processes(self.proc)
        return self.clock(), {name: tree_ticks(procs, root) for name, root in roots.items()}, machine_ticks(self.proc)

    def begin(self, roots: Mapping[str, Root]) -> None:
        self._start = self._read(roots)

    def end(self, roots: Mapping[str, Root]) -> dict[str, float]:
        """{"window_s", "<name>_cpu_s", "<name>_cores" for each component, "components_total_cores",
        "machine_busy_cores", "other_processes_cores" (busy minus the components), "machine_idle_cores",
        "machine_idle_share" (of all `cores`), "cores"}."""
        if self._start is None:
            raise RuntimeError("end() before begin()")
        t0, before, (busy0, idle0) = self._start
        t1, after, (busy1, idle1) = self._read(roots)
        wall = max(t1 - t0, 1e-9)
        out: dict[str, float] = {"window_s": round(wall, 2)}
        total = 0.0
        for name in roots:
            cpu = max(0, after[name] - before.get(name, 0)) / CLK_TCK
            total += cpu
            out[f"{name}_cpu_s"] = round(cpu, 2)
            out[f"{name}_cores"] = round(cpu / wall, 3)
        busy, idle = (busy1 - busy0) / CLK_TCK, (idle1 - idle0) / CLK_TCK
        out.update({
            "components_total_cpu_s": round(total, 2),
            "components_total_cores": round(total / wall, 3),
            "machine_busy_cores": round(busy / wall, 3),
            "other_processes_cores": round(max(0.0, busy - total) / wall, 3),
            "machine_idle_cores": round(idle / wall, 3),
            "machine_idle_share": round(idle / (busy + idle), 3) if busy + idle else float("nan"),
            "cores": self.cores,
        })
        return out
