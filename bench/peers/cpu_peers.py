#!/usr/bin/env python3
"""graphfuse against its CPU peers on the transformer blocks of `graphfuse demo`, in one process:
graphfuse (InferenceSession on the block's ONNX export), onnxruntime (the same ONNX file),
torch.compile (default inductor) and PyTorch eager.

Per block (default: GPT-2 block and BERT layer at seq 128, LLaMA-7B block at seq 32 and seq 1;
batch 1; weights and ops of bench/peers/block_torch.py's Block):

  1. the nn.Module is exported with torch.onnx.export (--exporter: dynamo, the default of torch
     2.15, or torchscript; weights embedded, since graphfuse reads no external data) into
     --cache-dir and checked with onnx.checker; a file already there for the same block, dtype,
     exporter, torch version and block_torch.py source is reused;
  2. each peer is built and warmed up, and its output is compared with eager's (max abs error,
     and within rtol / atol * max(1, max|eager|)); a peer that fails to build, run or export is
     reported and left out, the others go on;
  3. the peers are timed in rounds: per round, each peer in turn makes --switch-calls untimed
     calls (the previous peer's pool threads spin a while after its last call) and --repeats
     timed ones, so that a shared machine's noise falls on all alike; medians over the rounds'
     calls. The CPU that other processes took meanwhile is measured (/proc/stat less this
     process; "noisy" above 0.15 cores); --wait-quiet S waits for a quiet second first.

Exit status 1 when a peer failed (other than a bf16 model it has no kernels for) or its output differs from eager's beyond the tolerance
(f32: rtol 1e-3, atol 1e-4; bf16: 5e-2, 5e-2), after the table.

Threads: torch.set_num_threads(T), InferenceSession(threads=T), onnxruntime intra_op T, inter_op
1, sequential, ORT_ENABLE_ALL. --dtype bf16 runs the module in bf16 behind f32 casts at its input
and output (the same for every peer; the ONNX file is the export of that module):
graphfuse runs the f32 model with its GEMM weights held in bf16 (InferenceSession(bf16_weights=True):
weights rounded once, activations and sums f32); onnxruntime runs the bf16 export if its CPU kernels
take bf16, else "no bf16 kernels"; the error goes below the table.

Command (from the repository root; graphfuse importable: the venv after `pip install .`, or
PYTHONPATH over a build whose extension sits beside python/graphfuse):

    ~/.cache/graphfuse/venv/bin/python bench/peers/cpu_peers.py --wait-quiet 120 --json OUT.json
        [--blocks gpt2,bert,llama7b-seq32,llama7b-seq1] [--threads 2] [--rounds 10] [--repeats 3]
        [--dtype f32|bf16] [--tiny]

Block names: PRESET or PRESET-seqN with PRESET in llama7b, llama-small, gpt2, bert. --tiny
shrinks every block (hidden 64, 4 heads, ffn 128, seq at most 16) to check the script quickly.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

PEERS = ("graphfuse", "onnxruntime", "torch.compile", "eager")
DEFAULT_BLOCKS = "gpt2,bert,llama7b-seq32,llama7b-seq1"
TOL = {"f32": (1e-3, 1e-4), "bf16": (5e-2, 5e-2)}  # rtol, atol (times max(1, max|eager|))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default=DEFAULT_BLOCKS, help=f"comma-separated PRESET[-seqN] (default {DEFAULT_BLOCKS})")
    ap.add_argument("--threads", type=int, default=2, help="threads of every peer (default 2)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of interleaved calls (default 10)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per peer per round (default 3)")
    ap.add_argument("--switch-calls", type=int, default=1, help="untimed calls per peer per round before its timed ones (default 1)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each block's timed calls, wait up to S seconds for a second in which other "
                         "processes use under 0.15 cores (default 0: do not wait)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo",
                    help="torch.onnx.export(dynamo=True) (default) or the TorchScript exporter (dynamo=False)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, "bench", "results", "peers"),
                    help="where the ONNX exports go and are reused from (default bench/results/peers)")
    ap.add_argument("--tiny", action="store_true", help="shrink the blocks (a quick check of the script)")
    ap.add_argument("--json", metavar="OUT", help="write every figure as JSON to OUT")
    return ap.parse_args(argv)


args = parse_args()
_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="gf_peers_inductor_")  # a cold inductor compile
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE

import numpy as np  # noqa: E402
import torch  # noqa: E402

from block_torch import PRESETS, Block  # noqa: E402
from machine_load import cpu_snapshot, dynamo_frames, foreign_load, wait_quiet  # noqa: E402


# --- the blocks ------------------------------------------------------------------------------


def block_config(name: str, tiny: bool) -> dict:
    preset, seq = name, 0
    if "-seq" in name:
        preset, _, n = name.rpartition("-seq")
        seq = int(n)
    if preset not in PRESETS:
        raise SystemExit(f"unknown block {name!r}: presets are {sorted(PRESETS)} (optionally -seqN)")
    c = dict(PRESETS[preset])
    if seq:
        c["seq"] = seq
    if tiny:
        c.update(hidden=64, heads=4, ffn=128, seq=min(c["seq"], 16))
    c["preset"] = preset
    return c


class Cast(torch.nn.Module):
    """The block in another dtype behind f32 input and output (every peer then takes and gives
    f32 arrays; the casts are one pass over [seq, hidden])."""

    def __init__(self, block: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.block, self.dtype = block.to(dtype), dtype

    def forward(self, x):
        return self.block(x.to(self.dtype)).float()


def build_module(c: dict, dtype: str) -> torch.nn.Module:
    block = Block(c).eval()
    return Cast(block, torch.bfloat16).eval() if dtype == "bf16" else block


def onnx_path(name: str, c: dict, dtype: str) -> str:
    """The cache file of this block's export: its key covers what changes the file."""
    with open(os.path.join(HERE, "block_torch.py"), "rb") as fh:
        src = fh.read()
    key = json.dumps([c, dtype, args.exporter, torch.__version__], sort_keys=True).encode()
    digest = hashlib.sha256(key + src).hexdigest()[:12]
    return os.path.join(args.cache_dir, f"{name}{'-tiny' if args.tiny else ''}-{dtype}-{args.exporter}-{digest}.onnx")


def export(module: torch.nn.Module, x: torch.Tensor, path: str, log) -> dict:
    import onnx

    info = {"path": os.path.relpath(path, ROOT) if path.startswith(ROOT) else path, "exporter": args.exporter}
    if os.path.exists(path):
        info["reused"] = True
        t0 = time.perf_counter()
        onnx.checker.check_model(path)
        info["check_s"] = time.perf_counter() - t0
        log(f"  ONNX: reused {info['path']}")
        return info
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".part"
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.exporter == "dynamo":
            torch.onnx.export(module, (x,), tmp, dynamo=True, external_data=False, input_names=["x"], output_names=["y"],
                              verbose=False)
        else:
            torch.onnx.export(module, (x,), tmp, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    info["export_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    onnx.checker.check_model(tmp)
    info["check_s"] = time.perf_counter() - t0
    os.replace(tmp, path)
    info["reused"] = False
    model = onnx.load(path, load_external_data=False)
    info["opset"] = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    info["nodes"] = len(model.graph.node)
    info["mb"] = os.path.getsize(path) / 1e6
    log(f"  ONNX: exported {info['path']} ({info['mb']:.0f} MB, opset {info['opset']}, {info['nodes']} nodes) "
        f"in {info['export_s']:.1f} s, checked in {info['check_s']:.1f} s")
    return info


# --- the peers -------------------------------------------------------------------------------


def make_peer(peer: str, module, path: str, threads: int, f32_path: str):
    """A callable x (torch f32 tensor) -> output (torch or numpy)."""
    if peer == "eager":
        return module
    if peer == "torch.compile":
        return torch.compile(module)
    if peer == "graphfuse":
        import graphfuse

        # bf16 on the CPU: the f32 model with its GEMM weights held in bf16 (bf16_weights).
        if args.dtype == "bf16":
            sess = graphfuse.InferenceSession(f32_path, threads=threads, bf16_weights=True)
        else:
            sess = graphfuse.InferenceSession(path, threads=threads)
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})[0]
    if peer == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})[0]
    raise ValueError(peer)




def warm_up(fn, x) -> tuple:
    """The first call's output and time, then calls until three in a row compile nothing new."""
    t0 = time.perf_counter()
    out = fn(x)
    first = time.perf_counter() - t0
    calls, settled = 1, 0
    while settled < 3 and calls < 50:
        mark = dynamo_frames()
        fn(x)
        calls += 1
        settled = settled + 1 if dynamo_frames() == mark else 0
    return out, first, calls


def compare(ref: torch.Tensor, out) -> dict:
    out = torch.as_tensor(np.asarray(out)) if not isinstance(out, torch.Tensor) else out
    ref, out = ref.double(), out.double()
    rtol, atol = TOL[args.dtype]
    if out.shape != ref.shape:
        return {"ok": False, "error": f"shape {tuple(out.shape)}, eager {tuple(ref.shape)}"}
    scale = max(1.0, ref.abs().max().item())
    err = (out - ref).abs()
    max_abs = err.max().item()
    ok = bool(torch.all(err <= atol * scale + rtol * ref.abs()).item()) and bool(torch.isfinite(out).all())
    return {"max_abs": max_abs, "max_rel": max_abs / max(ref.abs().max().item(), 1e-30),
            "max_abs_eager": ref.abs().max().item(), "ok": ok}


# --- the machine -----------------------------------------------------------------------------








def machine() -> dict:
    model, flags, ident = "?", set(), {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k.strip() == "model name" and model == "?":
                    model = v.strip()
                elif k.strip() in ("cpu family", "model") and k.strip() not in ident:
                    ident[k.strip()] = v.strip()
                elif k.strip() == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    if ident:  # a VM's model name can be as bare as "AMD EPYC"
        model += f" (family {ident.get('cpu family', '?')} model {ident.get('model', '?')})"
    want = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        if subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                          text=True).stdout.strip():
            commit += "+dirty"
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for mod in ("onnx", "onnxruntime", "onnxscript", "graphfuse"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", None) or importlib.metadata.version(mod)
            if mod == "graphfuse":
                versions["graphfuse_from"] = os.path.dirname(m.__file__)
        except Exception as e:  # noqa: BLE001 (a missing peer is reported, not fatal)
            versions[mod] = f"unavailable ({e})"
    return {"cpu": model, "cpus": os.cpu_count(), "flags": {f: f in flags for f in want},
            "versions": versions, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# --- one block -------------------------------------------------------------------------------


def run_block(name: str, peers: list, log) -> dict:
    c = block_config(name, args.tiny)
    log(f"\n== {name}: {c['family']} hidden {c['hidden']} heads {c['heads']} ffn {c['ffn']} seq {c['seq']}, "
        f"{args.dtype}, {args.threads} threads")
    torch._dynamo.reset()
    module = build_module(c, args.dtype)
    x = torch.rand(1, c["seq"], c["hidden"], generator=torch.Generator().manual_seed(11)) * 2 - 1
    xn = x.numpy()
    res = {"block": name, "config": {k: c[k] for k in ("preset", "family", "hidden", "heads", "ffn", "seq")},
           "weights_mb": sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6, "peers": {}}
    path = onnx_path(name, c, args.dtype)
    f32_path = onnx_path(name, c, "f32")
    onnx_error = None
    if any(p in peers for p in ("graphfuse", "onnxruntime")):
        try:
            res["onnx"] = export(module, x, path, log)
            if args.dtype == "bf16" and "graphfuse" in peers:  # graphfuse reads the f32 model (bf16_weights)
                res["onnx_f32"] = export(build_module(c, "f32"), x, f32_path, log)
        except Exception as e:  # noqa: BLE001
            onnx_error = f"ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            res["onnx"] = {"error": onnx_error, "traceback": traceback.format_exc()}
            log(f"  {onnx_error}")
        gc.collect()
    fns, entries = {}, {}
    with torch.inference_mode():
        ref = module(x)
        for p in peers:
            entry = entries.setdefault(p, {})
            if p in ("graphfuse", "onnxruntime") and onnx_error:
                entry["error"] = onnx_error
                continue
            try:
                t0 = time.perf_counter()
                fn = make_peer(p, module, path, args.threads, f32_path)
                entry["build_s"] = time.perf_counter() - t0
                arg = xn if p in ("graphfuse", "onnxruntime") else x
                out, first, calls = warm_up(fn, arg)
                entry.update(first_call_s=first, warmup_calls=calls, check=compare(ref, out))
                fns[p] = (fn, arg)
                chk = entry["check"]
                log(f"  {p:13s} built {entry['build_s']:6.2f} s, first call {first:6.2f} s; vs eager: "
                    + (f"max abs {chk['max_abs']:.3g} (max|eager| {chk['max_abs_eager']:.3g}) -> "
                       f"{'ok' if chk['ok'] else 'MISMATCH'}" if "max_abs" in chk else chk["error"]))
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                entry["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:400]
                entry["traceback"] = traceback.format_exc()
                # A bf16 model the peer has no kernels for is a gap to note, not a failure.
                entry["unsupported"] = args.dtype != "f32" and type(e).__name__ in ("Unimplemented", "NotImplemented")
                log(f"  {p:13s} {'NOT SUPPORTED' if entry['unsupported'] else 'FAILED'}: {entry['error']}")
        order = [p for p in peers if p in fns]
        times = {p: [] for p in order}
        if not order:
            return res | {"peers": entries, "other_processes_cores": 0.0, "noisy": False}
        if args.wait_quiet > 0:
            log(f"  waited {wait_quiet(args.wait_quiet):.0f} s for a quiet machine")
        gc.collect()
        gc.disable()
        try:
            snap = cpu_snapshot()
            for r in range(args.rounds):
                # Rotate who goes first, so that no peer always follows the same one.
                for p in order[r % len(order):] + order[:r % len(order)]:
                    fn, arg = fns[p]
                    for _ in range(args.switch_calls):
                        fn(arg)
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        fn(arg)
                        times[p].append(time.perf_counter() - t0)
            other = foreign_load(snap, cpu_snapshot())
        finally:
            gc.enable()
    res["other_processes_cores"] = other
    res["noisy"] = other > 0.15
    log(f"  timed {args.rounds} rounds x {args.repeats} calls per peer; other processes used {other:.2f} cores"
        + ("  <-- NOISY" if res["noisy"] else ""))
    for p in order:
        t = sorted(times[p])
        entries[p].update(median_ms=statistics.median(t) * 1e3, min_ms=t[0] * 1e3, max_ms=t[-1] * 1e3, calls=len(t))
        log(f"  {p:13s} median {entries[p]['median_ms']:9.3f} ms  min {entries[p]['min_ms']:9.3f} ms")
    res["peers"] = entries
    del fns, module
    torch._dynamo.reset()
    gc.collect()
    return res


def table(results: list) -> str:
    lines = ["| block | " + " | ".join(f"{p} ms" for p in PEERS) + " | best peer / graphfuse | max abs err vs eager (gf / ort / compile) |",
             "|---|" + "---:|" * len(PEERS) + "---|---|"]
    for r in results:
        e = r["peers"]

        def cell(p):
            v = e.get(p)
            if v is None:
                return "-"
            if "median_ms" not in v:
                if v.get("unsupported"):
                    return "not supported yet" if p == "graphfuse" else "no bf16 kernels"
                return "failed" if "error" in v else "-"
            bad = "check" in v and not v["check"].get("ok", False)
            return f"{v['median_ms']:.3f}" + (" (MISMATCH)" if bad else "")

        ratio = "-"
        g = e.get("graphfuse", {}).get("median_ms")
        others = [(e[p]["median_ms"], p) for p in PEERS[1:] if "median_ms" in e.get(p, {})]
        if g and others:
            best, who = min(others)
            ratio = f"{best / g:.2f}x ({who})"
        errs = " / ".join(f"{e[p]['check']['max_abs']:.2g}" if "max_abs" in e.get(p, {}).get("check", {}) else "-"
                          for p in PEERS[:3])
        c = r["config"]
        lines.append(f"| {c['preset']} seq {c['seq']}{' tiny' if args.tiny else ''}{' (noisy)' if r['noisy'] else ''} | "
                     + " | ".join(cell(p) for p in PEERS) + f" | {ratio} | {errs} |")
    return "\n".join(lines)


def main():
    def log(msg):
        print(msg, flush=True)

    torch.set_num_threads(args.threads)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in peers:
        if p not in PEERS:
            raise SystemExit(f"unknown peer {p!r}: {', '.join(PEERS)}")
    if "eager" not in peers:
        peers.append("eager")  # the reference
    names = [b.strip() for b in args.blocks.split(",") if b.strip()]
    for b in names:
        block_config(b, args.tiny)
    m = machine()
    log(f"{m['cpu']}, {m['cpus']} CPUs, flags {', '.join(f for f, on in m['flags'].items() if on) or 'none'}; "
        f"{', '.join(f'{k} {v}' for k, v in m['versions'].items())}; commit {m['commit']}; {m['date']}")
    if args.dtype == "bf16":
        log("bf16: graphfuse runs the f32 export with bf16 GEMM weights (InferenceSession(bf16_weights=True))")
    results = []
    try:
        for b in names:
            results.append(run_block(b, peers, log))
    finally:
        shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)
    fl = ", ".join(f"{f} {'yes' if on else 'no'}" for f, on in m["flags"].items())
    print(f"\n{m['cpu']} ({m['cpus']} CPUs; {fl}); {args.dtype}, {args.threads} threads, batch 1; "
          f"torch {m['versions']['torch']}, onnxruntime {m['versions'].get('onnxruntime')}, "
          f"onnx {m['versions'].get('onnx')}; graphfuse at {m['commit']}; {m['date']}; ONNX by the {args.exporter} "
          f"exporter. Medians of {args.rounds} interleaved rounds x {args.repeats} calls; best peer / graphfuse > 1: "
          f"graphfuse is faster; (noisy): other processes took over 0.15 cores while timing.\n")
    print(table(results))
    for r in results:
        for p, v in r["peers"].items():
            if "error" in v:
                print(f"\n{r['block']}: {p} {'does not run it' if v.get('unsupported') else 'failed'}: {v['error']}")
    if args.json:
        doc = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "machine": m,
               "threads": args.threads, "dtype": args.dtype, "rounds": args.rounds, "repeats": args.repeats,
               "switch_calls": args.switch_calls, "exporter": args.exporter, "tiny": args.tiny,
               "tolerance": dict(zip(("rtol", "atol"), TOL[args.dtype])), "blocks": results}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
        print(f"\nwrote {args.json}")
    failed = [r["block"] for r in results if any("error" in v and not v.get("unsupported") for v in r["peers"].values())
              or any(not v.get("check", {}).get("ok", True) for v in r["peers"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
