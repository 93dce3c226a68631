"""CPU seconds and peak memory of a command and every process it starts (the JVM,
Python workers).

``resource.RUSAGE_CHILDREN`` misses the Spark JVM (it is not waited for by
its parent), so the pipeline benchmarks sample ``/proc`` instead: every
0.2 s, the utime + stime of each process descended from the command; a
process's last sample counts. On a shared machine this is the figure that
says how much work a run was, while wall time also says how busy the machine
was (Linux only). The peak memory is the largest sum of the tree's resident
set sizes seen at one sample.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, CPU seconds, resident bytes) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the command's name fields[0] is stat's field 3: ppid is field 4,
    # utime and stime are fields 14 and 15, rss (pages) is field 24
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, \
        int(fields[21]) * _PAGE


def run_measured(cmd: Sequence[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``cmd``; returns (result, wall seconds, CPU seconds of its process tree)."""
    result, wall, cpu, _ = run_measured_peak(cmd)
    return result, wall, cpu


def run_measured_peak(cmd: Sequence[str]) -> tuple[subprocess.CompletedProcess[str], float,
                                                   float, int]:
    """Run ``cmd``; returns (result, wall seconds, CPU seconds of its process
    tree, the tree's peak resident bytes)."""
    cpu: dict[int, float] = {}
    peak = [0]
    done = threading.Event()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def sample() -> None:
        while not done.wait(0.2):
            tree = {proc.pid}
            stats = {}
            for name in os.listdir("/proc"):
                if name.isdigit():
                    st = _stat(int(name))
                    if st is not None:
                        stats[int(name)] = st
            grew = True
            while grew:
                grew = False
                for pid, (ppid, _, _) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            rss = 0
            for pid in tree:
                if pid in stats:
                    cpu[pid] = stats[pid][1]
                    rss += stats[pid][2]
            peak[0] = max(peak[0], rss)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    thread.join()
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err), wall, \
        sum(cpu.values()), peak[0]
