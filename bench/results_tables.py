#!/usr/bin/env python3
"""Markdown tables from a bench_ops JSON file (--benchmark_out, with
--benchmark_repetitions=N --benchmark_report_aggregates_only=true): the median GB/s of every
op at each size and thread count beside the copy/triad/hand-loop rows of the same run, and the
dispatch rows. Usage: results_tables.py bench/results/bench_ops.json"""
import json
import re
import sys

SIZES = [4096, 65536, 1 << 20, 1 << 24]
SIZE_NAMES = {4096: "4 Ki", 65536: "64 Ki", 1 << 20: "1 Mi", 1 << 24: "16 Mi"}
THREADS = [1, 2]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    med = {}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = re.sub(r"/real_time$", "", b["run_name"])
        med[name] = b
    return doc["context"], med


def split_rows(med):
    """(label, base name) of every sized row, ceilings first, in the order bench_ops registers them."""
    ceilings = [("STREAM copy", "BM_StreamCopy"), ("STREAM triad", "BM_StreamTriad"),
                ("hand add (AVX-512)", "BM_HandAdd"), ("hand GELU (libmvec erff)", "BM_HandGelu"),
                ("hand SiLU (libmvec expf)", "BM_HandSilu")]
    rows = [(label, base) for label, base in ceilings if any(k.startswith(base + "/") for k in med)]
    ops = []
    for k in med:
        m = re.match(r"BM_Op/([^/]+)/", k)
        if m and m.group(1) not in ops:
            ops.append(m.group(1))
    return rows, [(op, "BM_Op/" + op) for op in ops]


def cell(med, base, n, t):
    b = med.get(f"{base}/{n}/threads:{t}")
    if b is None:
        return "-"
    if b.get("error_occurred"):
        return "error"
    s = f"{b['GBps']:.1f}"
    # The library may run a launch on fewer threads than allowed (small sizes): mark it.
    # (Only BM_Op rows have the "threads" counter; elsewhere the key is Google Benchmark's own.)
    if base.startswith("BM_Op/") and round(b.get("threads", t)) < t:
        s += "\u00b9"
    return s


def main():
    ctx, med = load(sys.argv[1])
    ceilings, ops = split_rows(med)
    head = "| row | " + " | ".join(f"{SIZE_NAMES[n]} T{t}" for n in SIZES for t in THREADS) + " |"
    sep = "|---|" + "---:|" * (len(SIZES) * len(THREADS))
    print(head)
    print(sep)
    for label, base in ceilings:
        print(f"| {label} | " + " | ".join(cell(med, base, n, t) for n in SIZES for t in THREADS) + " |")
    for label, base in ops:
        print(f"| {label} | " + " | ".join(cell(med, base, n, t) for n in SIZES for t in THREADS) + " |")
    print()
    print("\u00b9 the library ran this launch on 1 thread (too little work for 2).")
    print()
    print("| dispatch row | median time |")
    print("|---|---:|")
    for k, b in med.items():
        if k.startswith(("BM_DispatchEmpty", "BM_AddPublicPath", "BM_OmpEmptyRegion")):
            unit = b.get("time_unit", "ns")
            print(f"| {k} | {b['real_time']:.1f} {unit} |")


if __name__ == "__main__":
    main()
