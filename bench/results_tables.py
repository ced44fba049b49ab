#!/usr/bin/env python3
"""Markdown tables for bench/RESULTS.md.

  results_tables.py --ops bench_ops.json        the median GB/s of every op at each size and
      thread count beside the copy/triad/hand-loop rows of the same run, and the dispatch rows
      (bench_ops run with --benchmark_out, --benchmark_repetitions=N
      --benchmark_report_aggregates_only=true)
  results_tables.py --ratios r1.json r2.json ...  the bench_ratios runs side by side"""
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


def ops_tables(path):
    ctx, med = load(path)
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


def pct(v):
    return f"{100 * v:.1f}%"


def ratio_tables(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    runs_head = " | ".join(f"run {i + 1}: median (p25 - p75)" for i in range(len(runs)))
    print(f"| comparison | target | {runs_head} | met |")
    print("|---|---|" + "---:|" * len(runs) + "---|")
    first = runs[0]
    for k, row in enumerate(first["pairs"]):
        percent = row["ratio"].endswith("triad GB/s")
        fmt = pct if percent else (lambda v: f"{v:.3f}")
        target = "-" if row["target_op"] is None else f"{row['target_op']} {fmt(row['target'])}"
        cells, mets = [], []
        for r in runs:
            x = r["pairs"][k]
            assert x["name"] == row["name"]
            c = f"{fmt(x['ratio_median'])} ({fmt(x['ratio_p25'])} - {fmt(x['ratio_p75'])})"
            others = x["interference"]["others_cpu_s"] / max(x["interference"]["wall_s"], 1e-9) / r["machine"]["nproc"]
            if others > r["quiet_guard"]["max_others"]:
                c += " disturbed"
            cells.append(c)
            mets.append(x["met"])
        met = "-" if mets[0] is None else ("yes" if all(mets) else "no" if not any(mets) else "mixed")
        print(f"| {row['name']} | {target} | " + " | ".join(cells) + f" | {met} |")
        if "a_target_s" in row:
            cells = [f"{x['pairs'][k]['median_a_s'] * 1e6:.3f} us" for x in runs]
            amets = [x["pairs"][k]["a_met"] for x in runs]
            met = "yes" if all(amets) else "no" if not any(amets) else "mixed"
            print(f"| {row['a']}: time | <= {row['a_target_s'] * 1e6:.3f} us | " + " | ".join(cells) + f" | {met} |")
    for k, row in enumerate(first["dispatch"]):
        cells = [f"{x['dispatch'][k]['median_s'] * 1e9:.0f} ns ({x['dispatch'][k]['p25_s'] * 1e9:.0f} - "
                 f"{x['dispatch'][k]['p75_s'] * 1e9:.0f})" for x in runs]
        target = "-" if row["target_op"] is None else f"<= {row['target_s'] * 1e9:.0f} ns"
        mets = [x["dispatch"][k]["met"] for x in runs]
        met = "-" if mets[0] is None else ("yes" if all(mets) else "no" if not any(mets) else "mixed")
        print(f"| {row['name']} | {target} | " + " | ".join(cells) + f" | {met} |")
    d = [x["add_4096_two_thread_launch_minus_one_thread"] for x in runs]
    print("| RunOp(Add) 4096: 2-thread launch minus 1-thread | - | " + " | ".join(
        f"{x['median_s'] * 1e9:.0f} ns ({x['p25_s'] * 1e9:.0f} - {x['p75_s'] * 1e9:.0f})" for x in d) + " | - |")
    print()
    for i, r in enumerate(runs):
        i_ = r["interference"]
        print(f"run {i + 1}: {r['date_utc']}, commit {r['commit']}"
              + (f" (+ changes to {r['uncommitted_tracked_files']})" if r["uncommitted_tracked_files"] else "")
              + f", {r['run_seconds']:.0f} s; other processes / steal over the whole run, waits included: "
              f"{100 * i_['others_cpu_s'] / i_['wall_s'] / r['machine']['nproc']:.0f}% / "
              f"{100 * i_['steal_s'] / i_['wall_s'] / r['machine']['nproc']:.0f}% of the CPUs")


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--ops":
        ops_tables(args[1])
    elif len(args) >= 2 and args[0] == "--ratios":
        ratio_tables(args[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
