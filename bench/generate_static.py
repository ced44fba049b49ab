#!/usr/bin/env python3
"""generate() with transformers' static KV cache: PyTorch eager against
torch.compile(model.forward, backend="graphfuse") (and inductor with --inductor), CPU, f32, one
process, the same tokens required of every variant.

transformers' advice for torch.compile is the static cache (cache_implementation="static"): its
shapes stay fixed, and each step writes its K / V rows in place (index_copy_). The model is
transformers' LlamaForCausalLM with random weights (--hidden, --layers; heads of 64, a quarter as
many K / V heads, ffn 11/4 of hidden, vocab 32000), a random prompt of --prompt tokens, greedy.

Per variant:
  * per decode token: (T(generate of --new tokens) - T(generate of 1 token)) / (--new - 1), each T
    the median of --repeats runs, the variants taking turns (an untimed generate first in each
    turn, so that the previous variant's spinning threads are gone) so that the noise of a
    shared machine hits them alike;
  * prefill: T(generate of 1 token);
  * for graphfuse, the graphfuse compilations per Dynamo graph (graphfuse.torch_backend.reports())
    and the ATen ops that ran in graphfuse partitions against those left to PyTorch;
  * peak RSS of the process at the end (all variants share the process).
The run fails (exit status 1) when a variant's tokens differ from eager's.

    PYTHONPATH=python python bench/generate_static.py [--hidden 1024] [--layers 4] [--prompt 32]
        [--new 24] [--repeats 5] [--threads 2] [--inductor]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import torch
import transformers

import graphfuse.torch_backend as gtb


def build(args):
    torch.manual_seed(0)
    heads = max(1, args.hidden // 64)
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
        max_position_embeddings=max(256, 2 * (args.prompt + args.new)),
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=24)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--inductor", action="store_true", help="also torch.compile(backend='inductor')")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    ids = torch.randint(0, 32000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    variants = {"eager": build(args)}
    variants["graphfuse"] = build(args)
    variants["graphfuse"].forward = torch.compile(variants["graphfuse"].forward, backend="graphfuse",
                                                  options={"threads": args.threads})
    if args.inductor:
        variants["inductor"] = build(args)
        variants["inductor"].forward = torch.compile(variants["inductor"].forward, backend="inductor")

    def generate(model, new):
        return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              cache_implementation="static")

    tokens, first_ms = {}, {}
    with torch.no_grad():
        for name, model in variants.items():  # warm-up: compiles prefill and decode
            t = time.perf_counter()
            tokens[name] = generate(model, args.new).tolist()
            first_ms[name] = (time.perf_counter() - t) * 1e3
            generate(model, 1)
        times = {name: {1: [], args.new: []} for name in variants}
        for _ in range(args.repeats):
            for name, model in variants.items():
                # An untimed call first: the previous variant's threads (OpenMP's workers,
                # graphfuse's pool) spin a while after its last call and would share the cores.
                generate(model, 1)
                for new in (1, args.new):
                    t = time.perf_counter()
                    generate(model, new)
                    times[name][new].append(time.perf_counter() - t)

    print(f"LLaMA hidden {args.hidden}, {args.layers} layers, prompt {args.prompt}, {args.new} new tokens, "
          f"static cache, {args.threads} threads, median of {args.repeats}")
    print(f"{'variant':10} {'ms/token':>9} {'prefill ms':>11} {'first generate ms':>18}  same tokens")
    ok = True
    for name in variants:
        t1 = statistics.median(times[name][1])
        tn = statistics.median(times[name][args.new])
        same = tokens[name] == tokens["eager"]
        ok &= same
        print(f"{name:10} {(tn - t1) / (args.new - 1) * 1e3:9.2f} {t1 * 1e3:11.1f} {first_ms[name]:18.0f}  {same}")
    reports = gtb.reports()
    per_graph = {}
    for r in reports:
        per_graph[r["graph"]] = per_graph.get(r["graph"], 0) + 1
    in_gf = sum(sum(p["ops"] for p in r["partitions"]) for r in reports)
    left = sum(v["count"] for r in reports for v in r["fallback"].values())
    print(f"graphfuse: {len(per_graph)} Dynamo graphs, compilations per graph {sorted(per_graph.values())}; "
          f"ATen ops in graphfuse {in_gf}, left to PyTorch {left} "
          f"({', '.join(sorted({k for r in reports for k in r['fallback']}))})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    if not ok:
        print("error: a variant's tokens differ from eager's", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
