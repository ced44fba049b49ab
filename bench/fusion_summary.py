#!/usr/bin/env python3
"""Summarizes one bench/fusion_bench.sh run (its output folder) as markdown tables."""
import glob
import json
import os
import sys

out = sys.argv[1]
print(open(os.path.join(out, "info.txt")).read().strip().replace("\n", "  \n"))
print()

peers = {}  # (table, N) -> {impl@threads: median_us}
for f in glob.glob(os.path.join(out, "peers_*.txt")):
    for line in open(f):
        p = line.strip().split("|")
        if len(p) >= 10 and p[0] == "RES":
            _, table, case, impl, n, threads, mn, med, metric, unit = p[:10]
            peers.setdefault((table, int(n)), {})[f"{impl}@{threads}T"] = float(med)

PEER_TABLE = {"chain": "chainA", "gelu": "chainB_gelu", "silu": "chainB_silu", "residual": None}
WANT = {"torch eager": ["torch_eager_alloc", "torch_eager"], "numexpr": ["numexpr"],
        "numpy": ["numpy_opbyop_alloc", "numpy_opbyop", "numpy_opbyop(+torch.erf)"]}


def best(row, prefixes):
    """The fastest thread count of the first implementation name that is present."""
    for pre in prefixes:
        v = [t for k, t in row.items() if k.split("@")[0] == pre]
        if v:
            return min(v)
    return None


def fmt_us(us):
    return "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.2f} us")


for preset in ["chain", "gelu", "silu", "residual"]:
    rows = []
    for n in [4096, 65536, 1048576, 16777216]:
        path = os.path.join(out, f"{preset}-{n}.json")
        if not os.path.exists(path):
            continue
        j = json.load(open(path))
        un, fu = j["latency_ms"]["unfused"] * 1e3, j["latency_ms"]["fused"] * 1e3
        g = j["gbps"]
        pr = peers.get((PEER_TABLE[preset], n), {}) if PEER_TABLE[preset] else {}
        torch_us, ne_us, np_us = best(pr, WANT["torch eager"]), best(pr, WANT["numexpr"]), best(pr, WANT["numpy"])
        ratio = lambda other: "-" if other is None else f"{other / fu:.2f}x"
        na = j["latency_ms"].get("native")
        native = (f"{fmt_us(na * 1e3)} | {un / (na * 1e3):.2f}x | {100 * g['native'] / g['triad']:.0f}%" if na
                  else "- | - | -")
        rows.append(f"| {n} | {j['kernels_unfused']} -> {j['kernels_fused']} | {fmt_us(un)} | {fmt_us(fu)} | "
                    f"{un / fu:.2f}x | {g['fused']:.1f} | {g['triad']:.1f} | {100 * g['fused'] / g['triad']:.0f}% | {native} | "
                    f"{fmt_us(torch_us)} ({ratio(torch_us)}) | {fmt_us(ne_us)} ({ratio(ne_us)}) | {fmt_us(np_us)} ({ratio(np_us)}) |")
    if not rows:
        continue
    print(f"### preset `{preset}`\n")
    print("| elements | kernels | graphfuse unfused | graphfuse fused | fused speedup | fused GB/s | triad GB/s "
          "| % of triad | fused, native loops | native speedup | native % of triad "
          "| torch eager (vs fused) | numexpr (vs fused) | numpy (vs fused) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()

bf = os.path.join(out, "bench_fusion.json")
if os.path.exists(bf):
    print("### Google Benchmark: fused plans beside hand-written fused loops (medians)\n")
    print("| benchmark | time |")
    print("|---|---|")
    for b in json.load(open(bf))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            t, unit = b["real_time"], b["time_unit"]
            print(f"| {b['run_name']} | {t:.2f} {unit} |")
