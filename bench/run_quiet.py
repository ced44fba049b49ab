#!/usr/bin/env python3
"""Runs a benchmark command when the machine is quiet and says how quiet it stayed.

  run_quiet.py [--max-busy 0.05] [--wait 1800] [--log FILE] -- command args...

Waits (at most --wait seconds) until other processes used less than --max-busy of all CPUs
over a 5 s window, then runs the command. Meanwhile it samples /proc/stat once a second and,
at the end, prints (to stderr, and as JSON to --log) the CPU share that other processes and
the hypervisor (steal) took during the run: overall and the worst 10 s window. The command's
own CPU time is taken out (its children are this script's children)."""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
NCPU = os.sysconf("SC_NPROCESSORS_ONLN")


def cpu_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq) / TICK, steal / TICK


def proc_tree_cpu(pid):
    """CPU seconds of pid (all threads), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    except (OSError, IndexError):
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-busy", type=float, default=0.05)
    ap.add_argument("--wait", type=float, default=1800)
    ap.add_argument("--log")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command")

    t_wait = time.time()
    while True:
        b0, _ = cpu_ticks()
        time.sleep(5)
        b1, _ = cpu_ticks()
        share = (b1 - b0) / (5 * NCPU)
        if share < a.max_busy:
            break
        if time.time() - t_wait > a.wait:
            print(f"run_quiet: still {share:.0%} busy after {a.wait:.0f} s of waiting; running anyway", file=sys.stderr)
            break
    waited = time.time() - t_wait

    samples = []  # (time, busy_s, steal_s, own_s)
    t0 = time.time()
    busy, steal = cpu_ticks()
    p = subprocess.Popen(cmd)
    samples.append((t0, busy, steal, 0.0))
    own_last = 0.0
    while p.poll() is None:
        time.sleep(1)
        own_last = max(own_last, proc_tree_cpu(p.pid))
        busy, steal = cpu_ticks()
        samples.append((time.time(), busy, steal, own_last))
    rc = p.returncode
    own_total = resource.getrusage(resource.RUSAGE_CHILDREN)
    own_total = own_total.ru_utime + own_total.ru_stime
    busy, steal = cpu_ticks()
    samples.append((time.time(), busy, steal, own_total))

    def share(i, j):
        dt = samples[j][0] - samples[i][0]
        others = (samples[j][1] - samples[i][1]) - (samples[j][3] - samples[i][3])
        st = samples[j][2] - samples[i][2]
        return max(0.0, others) / (dt * NCPU), st / (dt * NCPU)

    overall = share(0, len(samples) - 1)
    worst = overall  # runs shorter than a window: the whole run
    for i in range(len(samples)):
        j = i
        while j + 1 < len(samples) and samples[j][0] - samples[i][0] < 10:
            j += 1
        if samples[j][0] - samples[i][0] >= 5:
            worst = max(worst, share(i, j))
    report = {
        "cmd": cmd, "rc": rc, "waited_s": round(waited, 1), "wall_s": round(samples[-1][0] - t0, 1),
        "ncpu": NCPU, "others_share": round(overall[0], 4), "steal_share": round(overall[1], 4),
        "worst_10s_others_share": round(worst[0], 4), "worst_10s_steal_share": round(worst[1], 4),
        "loadavg_end": open("/proc/loadavg").read().split()[:3],
    }
    print("run_quiet: " + json.dumps(report), file=sys.stderr)
    if a.log:
        with open(a.log, "w") as f:
            json.dump(report, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
