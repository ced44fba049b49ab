#!/usr/bin/env python3
"""Greedy generation through InferenceSession: graphfuse against onnxruntime on the same exported
decoder, in one process, the same tokens required of both.

The model is transformers' LlamaForCausalLM with random weights (by default at TinyLlama's layer
shapes: hidden 2048, ffn 5632, 32 heads, 4 K / V heads, vocab 32000; --layers of them), exported
the way users export a decoder with a KV cache: torch.onnx.export (TorchScript exporter, opset
17) with dynamic axes, inputs input_ids, attention_mask, position_ids and past_key_values.<i>.key
/ .value, outputs logits and present.<i>.key / .value. The export is cached under --cache.

The loop is what a generation server runs: one run() for the prompt (--prompt tokens, past 0),
then one run() per new token, feeding back present.* as past_key_values.* (every call a new
sequence length). Per runtime, taking turns (--repeats generations each):

  prefill ms      the first call
  per-token ms    mean and last of the decode calls
  total ms        prefill and decode calls of one generation (median of the turns)
  load + first    the session's creation and its first generation, every length new
  planning ms     graphfuse's planning per decode call of the first generation (cache_stats),
                  median and max after the shape class's first three decode lengths
  RSS             the process's RSS after the runtime's generations (peak in the process too)

--runtimes may add torch: the same LlamaForCausalLM (the export's weights: the same seed) in
PyTorch eager through the same loop, its own DynamicCache carried from call to call instead of
present.* fed back. --dtype bf16 runs graphfuse with its GEMM weights in bf16
(InferenceSession(bf16_weights=True): activations and sums f32) and torch with the model in bf16
(onnxruntime has no CPU bf16 kernels: the default runtimes become torch and graphfuse).

The run fails (exit status 1) when the runtimes' tokens differ (f32), or when a runtime's tokens
differ between its turns (bf16, where the runtimes round differently: their agreement with the
first runtime's tokens is printed).

    ~/.cache/graphfuse/venv/bin/python bench/generate.py [--layers 4] [--prompt 128] [--new 64]
        [--repeats 3] [--threads 2] [--small] [--dtype f32|bf16] [--runtimes onnxruntime graphfuse torch]

--torch instead runs transformers' generate() itself (its default, dynamic KV cache; greedy,
exactly --new tokens after the --prompt tokens) on the same LlamaForCausalLM (vocab 32000, the
sizes the options give, random weights) under PyTorch eager, model.forward compiled by
torch.compile(backend="inductor") and by torch.compile(backend="graphfuse") (--torch-variants),
one model copy each, in one process, torch.set_num_threads(--threads):

  per-token ms    (T(generate of --new tokens) - T(generate of 1 token)) / (--new - 1)
  prefill ms      T(generate of 1 token)
  each T the median of --repeats, the variants taking turns, each turn after an untimed
  generate() of one token (the previous variant's threads stop spinning meanwhile); the first
  generate (compilations included) is reported too. graphfuse runs the model on its own pool of
  --threads; --graphfuse-torch-threads sets PyTorch's for that variant, which then runs only
  generate()'s bookkeeping (its idle OpenMP workers otherwise spin beside graphfuse's). Per compiled variant: the Dynamo graphs and
  the compilations of each (graphfuse: graphfuse.torch_backend.session_stats(), with how many
  plans its sessions made and how many came from a shape-class template). The run fails (exit
  status 1) when a variant's tokens differ from eager's.

    PYTHONPATH=python ~/.cache/graphfuse/venv/bin/python bench/generate.py --torch --hidden 1024
        --ffn 2816 --heads 16 --kv-heads 4 --layers 4 --prompt 32 --new 64 --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model(args):
    """The decoder with random weights (seed 0): what export() writes, and the torch runtime runs."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def export(path: str, args) -> None:
    """Exports the decoder with a KV cache to `path` (TorchScript exporter, dynamic axes)."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from export_hf_corpus import CausalLMWithPast

    model = build_model(args)
    module = CausalLMWithPast(model).eval()
    head = args.hidden // args.heads
    past = 3
    feeds = [torch.randint(0, 32000, (1, 2)), torch.ones(1, past + 2, dtype=torch.int64),
             torch.arange(past, past + 2).unsqueeze(0)]
    names = ["input_ids", "attention_mask", "position_ids"]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total_seq"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    outs = ["logits"]
    for i in range(args.layers):
        for kv in ("key", "value"):
            feeds.append(torch.randn(1, args.kv_heads, past, head))
            names.append(f"past_key_values.{i}.{kv}")
            axes[names[-1]] = {0: "batch", 2: "past_seq"}
            outs.append(f"present.{i}.{kv}")
            axes[outs[-1]] = {0: "batch", 2: "total_seq"}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with torch.no_grad():
        torch.onnx.export(module, tuple(feeds), tmp, dynamo=False, opset_version=17, input_names=names,
                          output_names=outs, dynamic_axes=axes, do_constant_folding=True)
    os.replace(tmp, path)


def generate(sess, names, prompt, new, layers, kv_heads, head, kv_dtype=np.float32):
    """Greedy loop; returns (tokens, per-call ms, planning ms per call or None)."""
    ids = prompt
    past = [np.zeros((1, kv_heads, 0, head), kv_dtype) for _ in range(2 * layers)]
    tokens, times, planning = [], [], []
    total = 0
    stats = getattr(sess, "cache_stats", None)
    for step in range(new):
        total += ids.shape[1]
        feed = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                "position_ids": np.arange(total - ids.shape[1], total, dtype=np.int64)[None, :]}
        for i, p in enumerate(past):
            feed[names[3 + i]] = p
        before = stats()["planning_ms"] if stats else 0.0
        t = time.perf_counter()
        out = sess.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
        planning.append(stats()["planning_ms"] - before if stats else None)
        nxt = int(np.argmax(out[0][0, -1]))
        tokens.append(nxt)
        past = out[1:]
        ids = np.array([[nxt]], np.int64)
    return tokens, times, planning


class TorchSession:
    """LlamaForCausalLM in PyTorch eager behind run(None, feed): the loop's feeds, its own
    DynamicCache carried between calls (reset when a call starts from position 0), the logits
    returned as f32 and the pasts as they were given (the loop feeds them back unread)."""

    def __init__(self, model, threads: int):
        import torch

        self.torch, self.model, self.threads, self.cache = torch, model, threads, None

    def run(self, _, feed):
        import transformers

        torch = self.torch
        torch.set_num_threads(self.threads)
        pos = torch.from_numpy(feed["position_ids"])
        if int(pos[0, 0]) == 0:
            self.cache = transformers.DynamicCache()
        with torch.no_grad():
            out = self.model(input_ids=torch.from_numpy(feed["input_ids"]),
                             attention_mask=torch.from_numpy(feed["attention_mask"]), position_ids=pos,
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        pasts = [v for k, v in feed.items() if k.startswith("past_key_values")]
        return [out.logits[:, -1:].float().numpy()] + pasts


def torch_main(args) -> int:
    """--torch: generate() under eager, inductor and graphfuse (see the module's doc)."""
    import torch
    import transformers

    import graphfuse.torch_backend as gtb

    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)

    def build():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
            num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            max_position_embeddings=max(2048, 2 * (args.prompt + args.new)), tie_word_embeddings=False,
        )
        return transformers.LlamaForCausalLM(cfg).eval()

    dynamo_graphs = {}  # variant -> Dynamo graphs compiled (inductor: counted by a wrapping backend)

    def counting(name, backend):
        def compile_fn(gm, example_inputs):
            dynamo_graphs[name] = dynamo_graphs.get(name, 0) + 1
            return backend(gm, example_inputs)
        return compile_fn

    def own_forward(model, name):
        """model.forward over its own copy of the code object: Dynamo keeps its compiled graphs and
        its automatic-dynamic decisions per code object, which the variants would otherwise
        share (the second compiled variant would find the sizes the first saw change already
        dynamic, and compile other graphs than it would alone)."""
        import types

        f = type(model).forward
        code = f.__code__.replace(co_name=f"{f.__code__.co_name}_{name}")
        g = types.FunctionType(code, f.__globals__, code.co_name, f.__defaults__, f.__closure__)
        g.__kwdefaults__, g.__wrapped__ = f.__kwdefaults__, getattr(f, "__wrapped__", None)
        return types.MethodType(g, model)

    variants = {}
    for name in args.torch_variants:
        model = build()
        if name == "inductor":
            from torch._inductor.compile_fx import compile_fx

            model.forward = torch.compile(own_forward(model, name), backend=counting(name, compile_fx))
        elif name == "graphfuse":
            model.forward = torch.compile(own_forward(model, name), backend="graphfuse",
                                          options={"threads": args.threads})
        variants[name] = model
    ids = torch.randint(0, 32000, (1, args.prompt), generator=torch.Generator().manual_seed(1))

    def generate(model, new):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)

    # PyTorch's pool per variant: with graphfuse, only generate()'s own ops (argmax, the next ids)
    # run in it, and its OpenMP workers spinning after them share the cores with graphfuse's pool.
    torch_threads = {name: args.threads for name in variants}
    if args.graphfuse_torch_threads:
        torch_threads["graphfuse"] = args.graphfuse_torch_threads
    tokens, first_ms = {}, {}
    with torch.no_grad():
        for name, model in variants.items():  # warm-up: compiles the prefill and the decode graphs
            torch.set_num_threads(torch_threads[name])
            t = time.perf_counter()
            tokens[name] = generate(model, args.new).tolist()
            first_ms[name] = (time.perf_counter() - t) * 1e3
            print(f"  {name}: first generate {first_ms[name]:.0f} ms", flush=True)
        times = {name: {1: [], args.new: []} for name in variants}
        for _ in range(args.repeats):
            for name, model in variants.items():
                torch.set_num_threads(torch_threads[name])
                generate(model, 1)  # untimed: the previous variant's threads stop spinning meanwhile
                for new in (1, args.new):
                    t = time.perf_counter()
                    generate(model, new)
                    times[name][new].append(time.perf_counter() - t)

    print(f"\nLLaMA hidden {args.hidden}, ffn {args.ffn}, {args.heads} heads, {args.kv_heads} K / V heads, "
          f"{args.layers} layers, vocab 32000; prompt {args.prompt}, {args.new} new tokens, dynamic cache, "
          f"{args.threads} threads (PyTorch's with graphfuse: {torch_threads.get('graphfuse', args.threads)}), "
          f"median of {args.repeats}\n")
    print("| variant | per-token ms | prefill ms | first generate ms | Dynamo graphs | compilations per graph "
          "| same tokens |")
    print("|---|---|---|---|---|---|---|")
    ref = tokens.get("eager", next(iter(tokens.values())))
    ok = True
    stats = gtb.session_stats()
    for name in variants:
        t1 = statistics.median(times[name][1])
        tn = statistics.median(times[name][args.new])
        same = tokens[name] == ref
        ok &= same
        graphs, per_graph = "-", "-"
        if name == "graphfuse":
            graphs = str(len(stats))
            per_graph = str([s["compiles"] for s in stats.values()])
        elif name in dynamo_graphs:
            graphs, per_graph = str(dynamo_graphs[name]), "[1 each]"
        print(f"| {name} | {(tn - t1) / (args.new - 1) * 1e3:.2f} | {t1 * 1e3:.1f} | {first_ms[name]:.0f} | {graphs} | "
              f"{per_graph} | {same} |")
    if "graphfuse" in variants:
        for gid, s in stats.items():
            print(f"graphfuse graph {gid}: {s}")
        in_gf = sum(sum(p["ops"] for p in r["partitions"]) for r in gtb.reports())
        left = sum(v["count"] for r in gtb.reports() for v in r["fallback"].values())
        print(f"graphfuse: ATen ops in graphfuse partitions {in_gf}, left to PyTorch {left}")
    print(f"peak RSS {peak_rss_mb():.0f} MB")
    if not ok:
        print(f"error: a variant's tokens differ from {next(iter(tokens)) if 'eager' not in tokens else 'eager'}'s",
              file=sys.stderr)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--small", action="store_true", help="hidden 256, ffn 704, 4 heads, 1 K / V head (a quick check)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/graphfuse/models"))
    p.add_argument("--runtimes", nargs="+", default=None, choices=["onnxruntime", "graphfuse", "torch"],
                   help="default: onnxruntime graphfuse (f32), torch graphfuse (bf16)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                   help="bf16: graphfuse's GEMM weights and the torch model in bf16")
    p.add_argument("--torch", action="store_true", help="transformers' generate() under torch.compile backends")
    p.add_argument("--torch-variants", nargs="+", default=["eager", "inductor", "graphfuse"],
                   choices=["eager", "inductor", "graphfuse"])
    p.add_argument("--graphfuse-torch-threads", type=int, default=0,
                   help="--torch: PyTorch's threads while the graphfuse variant runs (default: --threads)")
    args = p.parse_args()
    if args.small:
        args.hidden, args.ffn, args.heads, args.kv_heads = 256, 704, 4, 1
    if args.torch:
        if args.dtype != "f32":
            p.error("--torch runs f32; --dtype bf16 is for the loop of --runtimes")
        return torch_main(args)
    if args.runtimes is None:
        args.runtimes = ["onnxruntime", "graphfuse"] if args.dtype == "f32" else ["torch", "graphfuse"]
    if args.dtype == "bf16" and "onnxruntime" in args.runtimes:
        p.error("onnxruntime has no CPU bf16 kernels: --dtype bf16 runs torch and graphfuse")
    name = f"llama_h{args.hidden}_f{args.ffn}_a{args.heads}_kv{args.kv_heads}_l{args.layers}_ts_kv"
    path = os.path.join(args.cache, name, "model.onnx")
    if not os.path.exists(path):
        print(f"exporting {path} ...", file=sys.stderr, flush=True)
        export(path, args)
    size_mb = os.path.getsize(path) / 2**20
    head = args.hidden // args.heads
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32000, (1, args.prompt), dtype=np.int64)
    print(f"model {path} ({size_mb:.0f} MB), {args.dtype}, prompt {args.prompt}, {args.new} new tokens, "
          f"{args.threads} threads, RSS before loading {rss_mb():.0f} MB")

    sessions, load = {}, {}
    for rt in args.runtimes:
        before = rss_mb()
        t = time.perf_counter()
        if rt == "onnxruntime":
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            so.inter_op_num_threads = 1
            sessions[rt] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        elif rt == "torch":
            import torch

            model = build_model(args)
            sessions[rt] = TorchSession(model.to(torch.bfloat16) if args.dtype == "bf16" else model, args.threads)
        else:
            import graphfuse as gf

            sessions[rt] = gf.InferenceSession(path, threads=args.threads, bf16_weights=args.dtype == "bf16")
        load[rt] = (time.perf_counter() - t) * 1e3
        print(f"{rt}: loaded in {load[rt]:.0f} ms, RSS +{rss_mb() - before:.0f} MB", flush=True)
    names = ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(args.layers) for kv in ("key", "value")]

    results = {rt: [] for rt in sessions}
    rss_after = {}
    for r in range(args.repeats):
        for rt, sess in sessions.items():
            results[rt].append(generate(sess, names, prompt, args.new, args.layers, args.kv_heads, head))
            gc.collect()
            rss_after[rt] = rss_mb()
            print(f"  turn {r + 1} {rt}: prefill {results[rt][-1][1][0]:.1f} ms, tokens/s "
                  f"{1e3 * (args.new - 1) / sum(results[rt][-1][1][1:]):.1f}, RSS {rss_after[rt]:.0f} MB", flush=True)

    print()
    print("| runtime | load ms | prefill ms | per-token ms (mean) | last token ms | total ms "
          "| load + first generation ms | planning per decode call, median / max |")
    print("|---|---|---|---|---|---|---|---|")
    tokens = {}
    for rt, runs in results.items():
        tokens[rt] = runs[0][0]
        prefill = statistics.median(t[0] for _, t, _ in runs)
        mean = statistics.median(statistics.mean(t[1:]) for _, t, _ in runs)
        last = statistics.median(t[-1] for _, t, _ in runs)
        total = statistics.median(sum(t) for _, t, _ in runs)
        first = load[rt] + sum(runs[0][1])
        plan = "-"
        if runs[0][2][0] is not None:
            # After the class's first three decode lengths (planned from the model: two to fit
            # its template, one to check it), in the first generation, where every length is new.
            later = runs[0][2][4:]
            plan = f"{statistics.median(later):.2f} / {max(later):.2f} ms" if later else "-"
        print(f"| {rt} | {load[rt]:.0f} | {prefill:.1f} | {mean:.2f} | {last:.2f} | {total:.0f} | {first:.0f} | {plan} |")
    if "graphfuse" in sessions:
        s = sessions["graphfuse"].cache_stats()
        print(f"\ngraphfuse cache_stats: {s}")
    print(f"RSS at the end {rss_mb():.0f} MB, peak {peak_rss_mb():.0f} MB")
    ref = next(iter(tokens.values()))
    stable = all(r[0] == tokens[rt] for rt, runs in results.items() for r in runs)
    if args.dtype == "f32":
        same = stable and all(t == ref for t in tokens.values())
        print("tokens:", "the same in every runtime and turn" if same else f"DIFFER: {tokens}")
        return 0 if same else 1
    first = next(iter(tokens))
    agree = {rt: sum(a == b for a, b in zip(t, ref)) for rt, t in tokens.items()}
    print("tokens:", "each runtime's the same in every turn" if stable else f"DIFFER between turns: {results}")
    print(f"tokens agreeing with {first}'s (bf16 rounds differently per runtime): "
          + ", ".join(f"{rt} {n} of {len(ref)}" for rt, n in agree.items()))
    return 0 if stable else 1


if __name__ == "__main__":
    sys.exit(main())
