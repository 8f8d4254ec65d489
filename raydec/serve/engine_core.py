"""A core of its own for an engine process.

An engine process steps its model from one thread; the HTTP side (Serve's proxy, the ingress, the
replica) and Ray's own processes run beside it on the same node. Left to the OS scheduler, the
engine migrates between cores (its caches go cold) and waits behind them: Ray starts its workers
at niceness 15, the engine among them, while its daemons and a local client run at 0.

``take_cores`` reserves the engine ``threads`` cores of the node (a group of ``threads`` cores,
from the highest-numbered down; the rest of the node keeps at least its first core); ``pin`` pins
every thread of the process to them and raises its priority to the node's default (niceness 0)
where the OS allows it. The reservation is an ``flock`` on a file per core group and slot in a
node-local folder: it ends with the process, however it ends. When the node has more engines than
spare groups, engines share a group (a second slot), the least shared first.

What it buys is measured by ``raydec bench serve`` (docs/benchmarks.md); ``ServedModel.engine_core``
turns it off.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

#: the niceness an engine asks for: the node's default (Ray's workers run at 15)
ENGINE_NICENESS = 0


def lock_folder() -> Path:
    """The node-local folder of the core reservations (one per user: flock needs a file this user can open)."""
    return Path(tempfile.gettempdir()) / f"raydec-engine-cores-{os.getuid()}"


@dataclass
class CorePlacement:
    """Where an engine runs: ``cores`` (empty: it floats as any Ray worker) and the niceness it got."""

    cores: tuple[int, ...]
    slot: int = 0  # 0: the group is this engine's alone; k: k engines were on it first
    nice: Optional[int] = None  # after ``pin``
    note: str = ""  # why it floats, or why its priority stayed
    _lock: Optional[int] = field(default=None, repr=False)  # the open file whose flock holds the reservation

    def describe(self) -> str:
        if not self.cores:
            return f"engine floats ({self.note})"
        shared = f", shared with {self.slot} other engine(s)" if self.slot else ""
        nice = f", niceness {self.nice}" if self.nice is not None else ""
        note = f" ({self.note})" if self.note else ""
        return f"engine pinned to core(s) {','.join(map(str, self.cores))}{shared}{nice}{note}"

    def release(self) -> None:
        """Ends the reservation (a process's exit ends it too)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def record(self) -> dict[str, object]:
        return {"engine_cores": list(self.cores), "engine_core_slot": self.slot, "engine_nice": self.nice}


def core_groups(allowed: Iterable[int], threads: int) -> list[tuple[int, ...]]:
    """The groups of ``threads`` cores an engine may take, best first: the allowed cores in order, cut
    into groups from the top, as long as at least one core stays below them for the rest of the node."""
    cores = sorted(allowed)
    return [tuple(cores[top - threads:top]) for top in range(len(cores), threads, -threads)]


def cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """The CPU quota of this process's container, in cores (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``);
    None without one."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            return None if quota_us < 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


def take_cores(threads: int, *, allowed: Optional[Iterable[int]] = None, quota: Optional[float] = -1.0,
               folder: Optional[Path] = None, max_slots: int = 64) -> CorePlacement:
    """Reserves a group of ``threads`` cores for this process (see the module's docstring); an empty
    placement, with why, when the node has none to spare, the OS has no CPU affinity, or a container's
    CPU quota is smaller than the cores it sees (``quota``, default: ``cpu_quota()``): those cores are
    the node's, shared with other containers, whose engines cannot see this one's reservation."""
    if not hasattr(os, "sched_getaffinity"):
        return CorePlacement((), note="this OS has no CPU affinity")
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    quota = cpu_quota() if quota == -1.0 else quota
    if quota is not None and quota < len(allowed):
        return CorePlacement((), note=f"a CPU quota of {quota:g} cores over {len(allowed)} shared ones (no cpuset of its own)")
    groups = core_groups(allowed, threads)
    if not groups:
        return CorePlacement((), note=f"{len(allowed)} core(s) for {threads} engine thread(s) and the rest of the node")
    folder = folder or lock_folder()
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(max_slots):
        for group in groups:
            fd = os.open(folder / f"cores-{'-'.join(map(str, group))}.slot-{slot}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            return CorePlacement(group, slot=slot, _lock=fd)
    return CorePlacement((), note=f"{max_slots} engines on each spare core group already")


def pin(placement: CorePlacement) -> CorePlacement:
    """Pins every thread of this process to ``placement.cores`` and raises their priority to
    ``ENGINE_NICENESS`` (threads started later inherit both); a floating placement is left as it is."""
    if not placement.cores:
        return placement
    threads = [int(tid) for tid in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in threads:
        os.sched_setaffinity(tid, placement.cores)
    current = os.getpriority(os.PRIO_PROCESS, 0)
    placement.nice = current
    if current > ENGINE_NICENESS:
        try:
            for tid in threads:  # Linux keeps a niceness per thread
                os.setpriority(os.PRIO_PROCESS, tid, ENGINE_NICENESS)
            placement.nice = ENGINE_NICENESS
        except PermissionError:
            placement.note = f"niceness stays {current}: raising a priority needs CAP_SYS_NICE"
    return placement
