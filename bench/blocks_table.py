#!/usr/bin/python3
"""Markdown table of bench/blocks.sh's results: usage blocks_table.py DIR."""
import glob
import json
import os
import sys

d = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(d, "blocks_*.json"))):
    if path.endswith("_torch.json"):
        continue
    j = json.load(open(path))
    tag = os.path.basename(path)[len("blocks_"):-len(".json")]
    torch_path = os.path.join(d, f"blocks_{tag}_torch.json")
    torch = json.load(open(torch_path))["latency_ms"] if os.path.exists(torch_path) else None
    c = j["config"]
    lu, lf = j["latency_ms"]["unfused"], j["latency_ms"]["fused"]
    ou, of = j["outside_gemm_ms"]["unfused"], j["outside_gemm_ms"]["fused"]
    rr = j.get("outside_gemm_round_ratio")
    rounds = f"{rr['median']:.2f}x ({rr['min']:.2f}-{rr['max']:.2f})" if rr else "-"
    rows.append(
        f"| {j['preset']} seq {c['seq']} | {j['kernels_unfused']} -> {j['kernels_fused']} | "
        f"{ou:.3f} -> {of:.3f} ({ou / of:.2f}x) | {rounds} | {j['gemm_ms']['unfused']:.2f} -> {j['gemm_ms']['fused']:.2f} | "
        f"{lu:.2f} | {lf:.2f} | {lu / lf:.2f}x | "
        + (f"{torch:.2f} | {torch / lf:.2f}x |" if torch else "- | - |")
        + f" {j['bytes_moved']['unfused'] / 1e6:.1f} -> {j['bytes_moved']['fused'] / 1e6:.1f} | "
        f"{'ok' if all(o['ok'] for o in j['outputs']) else 'DIFFERS'} |")
print("| block | kernels | outside GEMMs ms | outside, per-round ratio (min-max) | in GEMMs ms | unfused ms | fused ms | speedup | torch eager ms | fused vs torch | MB moved | check |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
