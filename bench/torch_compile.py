#!/usr/bin/env python3
"""torch.compile backends on the transformer blocks of `graphfuse demo`: PyTorch eager vs
torch.compile(backend="inductor") vs torch.compile(backend="graphfuse"), CPU, f32, one process.

What it measures, per block (default: the LLaMA-7B block, hidden 4096, 32 heads, ffn 11008, at
seq 32 and at seq 1 -- a decode step without KV cache -- and the GPT-2 block, 768, seq 128; batch 1):

  * the latency of one call of the block (median and min over N calls) through
      eager      the nn.Module under torch.inference_mode(),
      inductor   torch.compile(block, backend="inductor")       (default mode),
      graphfuse  torch.compile(block, backend="graphfuse", options={"threads": T}),
    with torch.set_num_threads(T). Each variant is warmed up until a call compiles nothing new;
    the timed calls are interleaved round-robin so that the noise of a shared machine hits the
    three alike: turns of 1 untimed + 3 timed calls (--switch-calls, --turn) of eager, then of
    inductor, then of graphfuse, again and again. The untimed call absorbs the switch between
    thread pools: OpenMP's workers (eager, inductor) and graphfuse's spin a while after a call,
    and the next variant's first call would share the cores with them. N defaults to enough
    calls for about --min-time seconds per variant, at least 5. The CPU that other processes
    used during the timed calls is measured (/proc/stat less this process) and a block is
    marked (noisy) above 0.15 cores; --wait-quiet S waits for a quiet second before timing;
  * the compile time: the wall time of each variant's first call (eager: its plain first call),
    and for graphfuse also the sum of graphfuse.torch_backend.reports()[...]["compile_ms"];
  * for graphfuse, the kernels after fusion (sum of the partitions' kernels_after), the ATen ops
    before, the partitions, and the ops left to PyTorch (fallback);
  * the error of each compiled output against eager (max abs, and max abs / max |eager|). The run
    fails (exit status 1, after the table) when graphfuse's output is not within
    rtol 1e-3, atol 1e-4 * max(1, max |eager|) of eager's; an inductor mismatch is only reported.

The blocks are nn.Modules whose weights are nn.Parameters (requires_grad=False) and whose rotary
tables and mask are buffers, so that the graphfuse backend folds them into constants (GEMM
weight packing and the projection fusions need constant weights). Weights are drawn as in
bench/peers/block_torch.py (its Block and block_tensors: same presets, seed, draw order, op sequence).
One module per block serves the three variants (the graphfuse backend copies the constants into
its sessions); blocks run one after the other and are freed in between.

Inductor's caches go to a fresh temporary directory (TORCHINDUCTOR_CACHE_DIR, removed at the end)
so that its compile time is a cold compile; --inductor-cache default keeps torch's usual one.

Command (from the repository root):

    PYTHONPATH=python python bench/torch_compile.py [--blocks llama7b-seq32,llama7b-seq1,gpt2]
        [--threads 2] [--min-time 2] [--json OUT.json]

Block names: PRESET or PRESET-seqN with PRESET in llama7b, llama-small, gpt2, bert (default seq
of the preset: 32 for llama7b, 128 for the others). Needs the Python venv with torch and
transformers at the versions pinned in tools/requirements.txt (tools/setup_venv.sh builds it)
and graphfuse importable (`pip install .`, or PYTHONPATH=python over a build whose
extension is in python/graphfuse). The full default run took 80 s on 2 Zen 4 cores (graphfuse's
compile of a LLaMA-7B block, ~11 s, is the longest: the 810 MB of weights go through an ONNX
protobuf and the session packs them); peak RSS 6.2 GB.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))

VARIANTS = ("eager", "inductor", "graphfuse")
DEFAULT_BLOCKS = "llama7b-seq32,llama7b-seq1,gpt2"
RTOL, ATOL = 1e-3, 1e-4


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default=DEFAULT_BLOCKS, help=f"comma-separated PRESET[-seqN] (default {DEFAULT_BLOCKS})")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and graphfuse's threads (default 2)")
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of timed calls per variant (default 2; at least 5 calls)")
    ap.add_argument("--min-calls", type=int, default=5, help="at least this many timed calls per variant (default 5)")
    ap.add_argument("--turn", type=int, default=3,
                    help="timed calls per variant per round-robin turn (default 3)")
    ap.add_argument("--switch-calls", type=int, default=1,
                    help="untimed calls at the start of each turn (default 1): the previous variant's idle "
                         "threads (OpenMP's, graphfuse's pool) spin a while after its last call and would "
                         "otherwise share the cores with the first timed call of the next")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each block's timed calls, wait up to S seconds for a second in which other "
                         "processes use under 0.15 cores (default 0: do not wait)")
    ap.add_argument("--json", metavar="OUT", help="write every figure as JSON to OUT")
    ap.add_argument("--inductor-cache", choices=["fresh", "default"], default="fresh",
                    help="fresh (default): inductor caches in a new temporary directory, so its compile is cold")
    return ap.parse_args()


args = parse_args()
_TMP_CACHE = None
if args.inductor_cache == "fresh":
    _TMP_CACHE = tempfile.mkdtemp(prefix="gf_inductor_cache_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _TMP_CACHE
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_TMP_CACHE, "triton")

import torch  # noqa: E402  (after the cache directory is set)

import graphfuse  # noqa: E402
import graphfuse.torch_backend as gtb  # noqa: E402
from block_torch import PRESETS, Block  # noqa: E402
from machine_load import cpu_snapshot, dynamo_frames, foreign_load, wait_quiet  # noqa: E402


# --- the blocks ------------------------------------------------------------------------------


def block_config(name: str) -> dict:
    preset, seq = name, 0
    if "-seq" in name:
        preset, _, n = name.rpartition("-seq")
        seq = int(n)
    if preset not in PRESETS:
        raise SystemExit(f"unknown block {name!r}: presets are {sorted(PRESETS)} (optionally -seqN)")
    c = dict(PRESETS[preset])
    if seq:
        c["seq"] = seq
    c["preset"] = preset
    return c


# --- measuring -------------------------------------------------------------------------------










def call_once(fn, x) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def warm_up(name, fn, x, log) -> dict:
    """First call (timed: the compile), then calls until one compiles nothing new, then two more."""
    n_reports = len(gtb.reports())
    before = dynamo_frames()
    t0 = time.perf_counter()
    out = fn(x)
    first = time.perf_counter() - t0
    calls, settled = 1, 0
    while settled < 3 and calls < 50:
        mark, mark_r = dynamo_frames(), len(gtb.reports())
        t = call_once(fn, x)
        calls += 1
        settled = settled + 1 if (dynamo_frames() == mark and len(gtb.reports()) == mark_r) else 0
    reps = gtb.reports()[n_reports:]
    log(f"  {name:9s} first call {first:8.2f} s, {calls} warm-up calls, last {t * 1e3:.2f} ms"
        + (f", dynamo events {dynamo_frames() - before}" if name != "eager" else ""))
    return {"first_call_s": first, "warmup_calls": calls, "last_warmup_s": t, "out": out, "reports": reps}


def compare(ref: torch.Tensor, out: torch.Tensor) -> dict:
    ref, out = ref.double(), out.double()
    scale = max(1.0, ref.abs().max().item())
    err = (out - ref).abs()
    max_abs = err.max().item()
    ok = bool(torch.all(err <= ATOL * scale + RTOL * ref.abs()).item()) and out.shape == ref.shape and bool(torch.isfinite(out).all())
    return {"max_abs": max_abs, "max_rel": max_abs / max(ref.abs().max().item(), 1e-30),
            "max_abs_eager": ref.abs().max().item(), "ok": ok}


def gf_summary(reps: list) -> dict:
    parts = [p for r in reps for p in r["partitions"]]
    fallback: dict = {}
    for r in reps:
        for op, v in r["fallback"].items():
            e = fallback.setdefault(op, {"count": 0, "reason": v["reason"]})
            e["count"] += v["count"]
    return {
        "graphs": len(reps),
        "compile_ms": sum(r["compile_ms"] for r in reps),
        "trace_ms": sum(r.get("trace_ms", 0.0) for r in reps),
        "aten_ops": sum(r["aten_ops"] for r in reps),
        "partitions": len(parts),
        "partition_ops": sum(p["ops"] for p in parts),
        "kernels_before": sum(p["kernels_before"] or 0 for p in parts),
        "kernels_after": sum(p["kernels_after"] or 0 for p in parts),
        "fallback": fallback,
        "reports": [{k: v for k, v in r.items()} for r in reps],
    }


def run_block(name: str, threads: int, min_time: float, min_calls: int, log) -> dict:
    c = block_config(name)
    log(f"\n== {name}: {c['family']} hidden {c['hidden']} heads {c['heads']} ffn {c['ffn']} seq {c['seq']}, "
        f"f32, {threads} threads")
    torch._dynamo.reset()
    t0 = time.perf_counter()
    block = Block(c).eval()
    weight_mb = sum(p.numel() * p.element_size() for p in block.parameters()) / 1e6
    log(f"  built in {time.perf_counter() - t0:.1f} s, weights {weight_mb:.0f} MB")
    x = torch.rand(1, c["seq"], c["hidden"], generator=torch.Generator().manual_seed(11)) * 2 - 1

    fns = {
        "eager": block,
        "inductor": torch.compile(block, backend="inductor"),
        "graphfuse": torch.compile(block, backend="graphfuse", options={"threads": threads}),
    }
    res = {"block": name, "config": {k: c[k] for k in ("preset", "family", "hidden", "heads", "ffn", "seq", "eps")},
           "weights_mb": weight_mb, "variants": {}}
    warm = {}
    with torch.inference_mode():
        for v in VARIANTS:
            warm[v] = warm_up(v, fns[v], x, log)
        ref = warm["eager"]["out"]
        for v in VARIANTS[1:]:
            cmp = compare(ref, warm[v]["out"])
            warm[v]["check"] = cmp
            log(f"  {v:9s} vs eager: max abs {cmp['max_abs']:.3g}, max abs / max|eager| {cmp['max_rel']:.3g} "
                f"(max|eager| {cmp['max_abs_eager']:.3g}) -> {'ok' if cmp['ok'] else 'MISMATCH'}")
        # N: enough calls for ~min_time s per variant at the variants' median warm-up speed.
        per = statistics.median(warm[v]["last_warmup_s"] for v in VARIANTS)
        turn = max(1, args.turn)
        n = max(min_calls, math.ceil(min_time / max(per, 1e-6)))
        rounds = math.ceil(n / turn)
        n = rounds * turn
        log(f"  timing {n} calls per variant: {rounds} rounds of {args.switch_calls} untimed + {turn} timed calls "
            f"of each of {', '.join(VARIANTS)}")
        times = {v: [] for v in VARIANTS}
        if args.wait_quiet > 0:
            waited = wait_quiet(args.wait_quiet)
            log(f"  waited {waited:.0f} s for a quiet machine")
        gc.collect()
        gc.disable()
        try:
            events = dynamo_frames()
            snap = cpu_snapshot()
            for _ in range(rounds):
                for v in VARIANTS:
                    for _ in range(args.switch_calls):
                        fns[v](x)
                    for _ in range(turn):
                        times[v].append(call_once(fns[v], x))
            recompiled = dynamo_frames() - events
            other = foreign_load(snap, cpu_snapshot())
        finally:
            gc.enable()
    if recompiled:
        log(f"  WARNING: Dynamo compiled during the timed calls ({recompiled} events)")
    res["rounds"], res["turn"], res["switch_calls"] = rounds, turn, args.switch_calls
    res["dynamo_events_while_timing"] = recompiled
    res["other_processes_cores"] = other
    log(f"  other processes used {other:.2f} cores meanwhile (load average {os.getloadavg()[0]:.2f})"
        + ("  <-- NOISY: the figures of this block are not trustworthy" if other > 0.15 else ""))
    for v in VARIANTS:
        t = sorted(times[v])
        entry = {"median_ms": statistics.median(t) * 1e3, "min_ms": t[0] * 1e3, "max_ms": t[-1] * 1e3,
                 "calls": len(t), "first_call_s": warm[v]["first_call_s"], "warmup_calls": warm[v]["warmup_calls"]}
        if "check" in warm[v]:
            entry["check"] = warm[v]["check"]
        if v == "graphfuse":
            entry["graphfuse"] = gf_summary(warm[v]["reports"])
        res["variants"][v] = entry
        log(f"  {v:9s} median {entry['median_ms']:9.2f} ms  min {entry['min_ms']:9.2f} ms")
    g = res["variants"]["graphfuse"]["graphfuse"]
    log(f"  graphfuse: {g['graphs']} graph(s), compile {g['compile_ms']:.0f} ms (trace {g['trace_ms']:.0f} ms), "
        f"{g['aten_ops']} ATen ops, {g['partitions']} partition(s) of {g['partition_ops']} ops, kernels "
        f"{g['kernels_before']} -> {g['kernels_after']}, fallback "
        + (", ".join(f"{k} x{e['count']} ({e['reason']})" for k, e in g["fallback"].items()) or "none"))
    del fns, warm, block
    torch._dynamo.reset()
    gc.collect()
    return res


def table(results: list) -> str:
    lines = [
        "| block | eager ms | inductor ms | graphfuse ms | graphfuse/inductor speedup | graphfuse/eager speedup "
        "| compile s (inductor / graphfuse) | graphfuse kernels (before -> after) | fallback ops |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        v = r["variants"]
        e, i, g = (v[k]["median_ms"] for k in VARIANTS)
        gs = v["graphfuse"]["graphfuse"]
        fb = ", ".join(f"{k.replace('aten.', '')} x{x['count']}" for k, x in gs["fallback"].items()) or "none"
        lines.append(
            f"| {r['block']} (seq {r['config']['seq']}){' (noisy)' if r['other_processes_cores'] > 0.15 else ''} | {e:.2f} | {i:.2f} | {g:.2f} | {i / g:.2f}x | {e / g:.2f}x "
            f"| {v['inductor']['first_call_s']:.1f} / {v['graphfuse']['first_call_s']:.2f} "
            f"(gf compile_ms {gs['compile_ms'] / 1e3:.2f}) | {gs['kernels_before']} -> {gs['kernels_after']} | {fb} |"
        )
    return "\n".join(lines)


def main():
    def log(msg):
        print(msg, flush=True)

    torch.set_num_threads(args.threads)
    names = [b.strip() for b in args.blocks.split(",") if b.strip()]
    for b in names:
        block_config(b)
    log(f"torch {torch.__version__}, graphfuse from {os.path.dirname(graphfuse.__file__)}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, inductor cache "
        f"{_TMP_CACHE or 'default'}")
    # Dynamo's and inductor's one-time start-up (imports, the C++ compiler's probe) on a toy
    # function, so that each block's first call times that block's compile only.
    t0 = time.perf_counter()
    with torch.inference_mode():
        for backend in ("inductor", "graphfuse"):
            torch.compile(lambda a: torch.relu(a) + 1, backend=backend)(torch.ones(8))
    torch._dynamo.reset()
    gtb.clear_reports()
    log(f"start-up of Dynamo, inductor and graphfuse on a toy function: {time.perf_counter() - t0:.1f} s")
    results = []
    try:
        for b in names:
            results.append(run_block(b, args.threads, args.min_time, args.min_calls, log))
    finally:
        if _TMP_CACHE:
            shutil.rmtree(_TMP_CACHE, ignore_errors=True)
    print("\nmedian of the timed calls; speedup = time of the other / time of graphfuse; compile s = first call's wall"
          " time; (noisy): other processes took over 0.15 cores during the timed calls\n")
    print(table(results))
    bad = [r["block"] for r in results if not r["variants"]["graphfuse"]["check"]["ok"]]
    warn = [r["block"] for r in results if not r["variants"]["inductor"]["check"]["ok"]]
    if args.json:
        doc = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "torch": torch.__version__,
               "threads": args.threads, "min_time_s": args.min_time, "turn": args.turn, "switch_calls": args.switch_calls, "cpus": os.cpu_count(),
               "inductor_cache": args.inductor_cache, "rtol": RTOL, "atol": ATOL,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "blocks": results}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
        print(f"\nwrote {args.json}")
    if warn:
        print(f"\nwarning: inductor's output differs from eager beyond rtol {RTOL} / atol {ATOL} on: {', '.join(warn)}")
    if bad:
        print(f"\nFAILED: graphfuse's output differs from eager beyond rtol {RTOL} / atol {ATOL}*max(1,max|eager|) on: "
              f"{', '.join(bad)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
