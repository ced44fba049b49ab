#!/usr/bin/env python3
"""CPU time of a LLaMA exported as users export it (transformers' default attention, sdpa)
beside the same model exported with attn_implementation="eager", by both exporters.

The model is transformers' LlamaForCausalLM at TinyLlama's layer shapes (hidden 2048, ffn 5632,
32 heads, 4 K / V heads), 2 layers, a vocabulary of 1024 (so that the layers, not the lm_head,
take the time), random weights, called as model(input_ids) at one static length (128 by
default). The dynamo exporter's sdpa and eager exports, and the TorchScript exporter's eager
one (it refuses sdpa with grouped-query heads), are each timed by `graphfuse bench` (fused
plan; medians of its interleaved samples), taking turns for --rounds rounds; the table gives
the median over rounds, the time per layer and the fused kernels.

Run in the project's venv (tools/setup_venv.sh) after building:

    ~/.cache/graphfuse/venv/bin/python bench/default_vs_eager.py [--seq 128] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(path, attn, exporter, seq, layers):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                                   max_position_embeddings=2048, tie_word_embeddings=False)
    if attn == "eager":
        cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Static(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids).logits

    ids = torch.randint(0, 1024, (1, seq))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        if exporter == "ts":
            torch.onnx.export(Static(model), (ids,), path, dynamo=False, opset_version=17, input_names=["input_ids"],
                              output_names=["logits"], do_constant_folding=True)
        else:
            torch.onnx.export(Static(model), (ids,), path, dynamo=True, input_names=["input_ids"],
                              output_names=["logits"])


def bench(binary, path, repeats, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([binary, "bench", path, "--repeats", str(repeats), "--threads", str(threads), "--json", f.name],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"graphfuse bench {path} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return json.load(open(f.name))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20, help="samples per graphfuse bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "graphfuse"))
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/graphfuse/models"))
    args = p.parse_args()
    # The TorchScript exporter refuses sdpa with grouped-query heads (enable_gqa), so its export
    # is the eager one only.
    runs = [("dynamo", "sdpa"), ("dynamo", "eager"), ("ts", "eager")]
    paths = {}
    for exporter, attn in runs:
        d = os.path.join(args.cache, f"llama_h2048_l{args.layers}_v1024_s{args.seq}_{attn}_{exporter}")
        paths[(exporter, attn)] = os.path.join(d, "model.onnx")
        if not os.path.exists(paths[(exporter, attn)]):
            print(f"exporting {exporter} {attn} to {d}", flush=True)
            export(paths[(exporter, attn)], attn, exporter, args.seq, args.layers)
    ms = {k: [] for k in runs}
    kernels = {}
    for rnd in range(args.rounds):
        for k in runs:
            j = bench(args.binary, paths[k], args.repeats, args.threads)
            ms[k].append(j["latency_ms"]["fused"])
            kernels[k] = j["kernels_fused"]
        print(f"round {rnd + 1}: " + ", ".join(f"{e} {a} {ms[(e, a)][-1]:.2f} ms" for e, a in runs), flush=True)
    print(f"\nLLaMA (TinyLlama layer shapes), {args.layers} layers, vocab 1024, seq {args.seq}, "
          f"{args.threads} threads; medians of {args.rounds} rounds")
    print("| exporter | attention | fused kernels | ms | ms per layer | / dynamo eager |")
    print("|---|---|---:|---:|---:|---:|")
    for exporter, attn in runs:
        med = statistics.median(ms[(exporter, attn)])
        ratio = med / statistics.median(ms[("dynamo", "eager")])
        print(f"| {exporter} | {attn} | {kernels[(exporter, attn)]} | {med:.2f} | {med / args.layers:.2f} | "
              f"{ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
