"""An engine's core of its own: which cores it reserves, sharing when the node has too few, the
reservation ending with its process, and the pinning and priority a real process gets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from raydec.serve.engine_core import core_groups, cpu_quota, take_cores


def test_groups_come_from_the_top_and_leave_the_first_core():
    assert core_groups([0, 1], 1) == [(1,)]
    assert core_groups([0, 1, 2, 3], 1) == [(3,), (2,), (1,)]
    assert core_groups([0, 1, 2, 3], 2) == [(2, 3)]
    assert core_groups([4, 0, 9, 2, 7], 2) == [(7, 9), (2, 4)]  # the allowed cores, whatever their numbers
    assert core_groups([0], 1) == [] and core_groups([0, 1], 2) == []


def test_engines_take_free_groups_first_then_share_the_fewest_held(tmp_path):
    held = [take_cores(1, allowed=[0, 1, 2], quota=None, folder=tmp_path) for _ in range(5)]
    assert [(p.cores, p.slot) for p in held] == [((2,), 0), ((1,), 0), ((2,), 1), ((1,), 1), ((2,), 2)]
    held[1].release()
    again = take_cores(1, allowed=[0, 1, 2], quota=None, folder=tmp_path)
    assert (again.cores, again.slot) == ((1,), 0)  # a released group is free again
    alone = take_cores(1, allowed=[0], quota=None, folder=tmp_path)
    assert alone.cores == () and "1 core(s)" in alone.note and "floats" in alone.describe()


def test_a_container_whose_quota_is_below_the_cores_it_sees_does_not_pin(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1" / "cpu"
    v2.mkdir()
    v1.mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(v2) is None
    (v2 / "cpu.max").write_text("200000 100000\n")
    assert cpu_quota(v2) == 2.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(tmp_path / "v1") is None
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    assert cpu_quota(tmp_path / "v1") == 1.5 and cpu_quota(tmp_path / "none") is None
    shared = take_cores(1, allowed=range(16), quota=2.0, folder=tmp_path / "locks")
    assert shared.cores == () and "quota of 2 cores over 16" in shared.note
    assert take_cores(1, allowed=range(4), quota=4.0, folder=tmp_path / "locks").cores == (3,)  # a quota of all it sees


TAKE_AND_PIN = """
import json, os, sys, threading
from pathlib import Path
from raydec.serve.engine_core import pin, take_cores
placement = pin(take_cores(1, quota=None, folder=Path(sys.argv[1])))
seen = {}
def later():
    seen["affinity"], seen["nice"] = sorted(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0)
thread = threading.Thread(target=later); thread.start(); thread.join()
print(json.dumps({**placement.record(), "thread": seen}), flush=True)
sys.stdin.read()  # holds its reservation until killed
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core to spare needs two")
def test_a_pinned_process_and_its_later_threads_run_on_its_core_until_it_dies(tmp_path):
    def start() -> tuple[subprocess.Popen, dict]:
        process = subprocess.Popen([sys.executable, "-c", TAKE_AND_PIN, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, preexec_fn=lambda: os.nice(10))  # as Ray starts a worker: below the node's default
        return process, json.loads(process.stdout.readline())

    first, placed = start()
    top = max(os.sched_getaffinity(0))
    assert placed["engine_cores"] == [top] and placed["engine_core_slot"] == 0
    assert sorted(os.sched_getaffinity(first.pid)) == [top] and placed["thread"]["affinity"] == [top]
    # niceness 0 where the OS lets a process raise its priority (root here; CAP_SYS_NICE elsewhere), else it stays
    assert placed["engine_nice"] == placed["thread"]["nice"] == os.getpriority(os.PRIO_PROCESS, first.pid)
    assert placed["engine_nice"] == (0 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0) + 10)
    second, shared = start()
    assert shared["engine_cores"] == [top] and shared["engine_core_slot"] == 1  # a second engine on a two-core node shares
    first.send_signal(signal.SIGKILL)
    first.wait()
    third, after = start()
    assert after["engine_cores"] == [top] and after["engine_core_slot"] == 0  # the killed process's reservation ended with it
    for process in (second, third):
        process.kill()
        process.wait()
