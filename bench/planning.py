#!/usr/bin/env python3
"""Planning time per new input signature against the time per call, on the transformers corpus.

graphfuse specializes a plan per input signature (graphfuse/model.h): the first call with a
new shape pays the planning (import for the shapes, passes, executor plan); later calls with
that shape find the plan in the cache. This prints, for models of tests/models/hf and several
shapes, the fused plan's planning time beside the median latency of one fused call (both from
one `graphfuse bench --shape ... --json` run each) and the number of calls that planning costs.

    python3 bench/planning.py [--graphfuse build/graphfuse] [--repeats 21]

Prints a Markdown table (the one in bench/RESULTS.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(ROOT, "tests", "models", "hf")

# (model directory, what, --shape flags)
CASES = [
    ("llama_ts_dynamic", "prefill 1x16", ["batch=1", "seq=16"]),
    ("llama_ts_dynamic", "prefill 1x128", ["batch=1", "seq=128"]),
    ("llama_ts_dynamic", "prefill 4x128", ["batch=4", "seq=128"]),
    ("llama_ts_kv", "decode, past 127", ["batch=1", "seq=1", "past_seq=127", "total_seq=128"]),
    ("llama_ts_kv", "decode, past 511", ["batch=1", "seq=1", "past_seq=511", "total_seq=512"]),
    ("gpt2_ts_dynamic", "prefill 1x128", ["batch=1", "seq=128"]),
    ("bert_ts_dynamic", "encode 1x128", ["batch=1", "seq=128"]),
]


def run(gf, model, shapes, repeats):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [gf, "bench", os.path.join(HF, model, "model.onnx"), "--repeats", str(repeats), "--json", f.name]
        for s in shapes:
            cmd += ["--shape", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        return json.load(open(f.name))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphfuse", default=os.path.join(ROOT, "build", "graphfuse"))
    ap.add_argument("--repeats", type=int, default=21)
    a = ap.parse_args()
    print("| model | shape | kernels unfused -> fused | planning (ms) | unfused call (ms) | fused call (ms) |"
          " calls that planning costs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, what, shapes in CASES:
        j = run(a.graphfuse, model, shapes, a.repeats)
        plan, call = j["planning_ms"], j["latency_ms"]["fused"]
        print("| %s | %s | %d -> %d | %.2f | %.3f | %.3f | %.0f |" % (model, what, j["kernels_unfused"], j["kernels_fused"],
                                                                 plan, j["latency_ms"]["unfused"], call, plan / call))


if __name__ == "__main__":
    main()
