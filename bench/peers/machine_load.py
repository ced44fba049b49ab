"""How busy a shared machine is while a benchmark times (bench/torch_compile.py and
bench/peers/cpu_peers.py): CPU snapshots, the load other processes add between two of them, a
wait for a quiet moment, and Dynamo's compile counter (to know when warm-up compiles nothing new)."""
import os
import time


def dynamo_frames() -> int:
    """A number that moves whenever Dynamo compiles a frame (or a graph)."""
    from torch._dynamo.utils import counters

    return sum(counters["stats"].values()) + sum(counters["frames"].values())


def cpu_snapshot() -> tuple:
    """(wall s, the machine's busy CPU s, this process's CPU s): the difference of two tells how
    much CPU other processes took meanwhile (the noise of a shared machine)."""
    with open("/proc/stat") as fh:
        f = [int(v) for v in fh.readline().split()[1:]]
    busy = (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    t = os.times()
    return time.perf_counter(), busy, t.user + t.system


def foreign_load(a: tuple, b: tuple) -> float:
    """Cores' worth of CPU that other processes used between two snapshots."""
    wall = max(b[0] - a[0], 1e-9)
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / wall


def wait_quiet(limit_s: float, threshold: float = 0.15) -> float:
    """Waits (up to limit_s) for a one-second window in which other processes use under
    `threshold` cores; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        a = cpu_snapshot()
        time.sleep(1.0)
        if foreign_load(a, cpu_snapshot()) < threshold:
            break
    return time.perf_counter() - t0
