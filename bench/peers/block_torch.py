#!/usr/bin/python3
"""PyTorch eager timing of the transformer blocks that `graphfuse demo` builds (same presets,
shapes, op sequence and thread count; random weights; inference mode).

usage: /usr/bin/python3 bench/peers/block_torch.py --preset llama7b [--seq N] [--past L] [--threads T] [--repeats R]
                                                   [--device cpu|cuda] [--dtype f32|bf16|f16] [--compile [--mode M]]
prints one JSON object: {"preset", "seq", "past", "threads", "device", "dtype", "compiled", "mode",
"latency_ms" (median), "min_ms", "repeats"}. On cuda every timed call is bracketed by
synchronizations; --compile times torch.compile's graph of the same block (after its warm-up
compilations); --mode passes torch.compile's mode (reduce-overhead replays CUDA graphs,
max-autotune also tunes its GEMM and Triton kernels while compiling). --past L (llama, gpt2)
runs the step that `graphfuse demo --past L` builds: random past K / V rows [1, heads, L,
head_dim] concatenated with the new ones before attention (the present rows returned beside the
output, as a decoder with a cache returns them), a causal mask over L + seq keys and RoPE at
positions L .. L + seq - 1; --seq 1 --past L is one decode step.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

PRESETS = {
    "llama7b": dict(family="llama", hidden=4096, heads=32, ffn=11008, seq=32, eps=1e-6),
    "llama-small": dict(family="llama", hidden=512, heads=8, ffn=1376, seq=128, eps=1e-6),
    "gpt2": dict(family="gpt2", hidden=768, heads=12, ffn=3072, seq=128, eps=1e-5),
    "bert": dict(family="bert", hidden=768, heads=12, ffn=3072, seq=128, eps=1e-5),
}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def block_tensors(c):
    """The block's random weights P (name -> f32 tensor, None where the family has none), its
    rotary tables cos and sin [seq, head_dim] (at positions past .. past + seq - 1), and its
    additive mask ([seq, past + seq] causal; BERT's padding mask), drawn from one seeded
    generator in a fixed order (bench/torch_compile.py builds its nn.Module from the same)."""
    d, f, nh = c["hidden"], c["ffn"], c["heads"]
    hd = d // nh
    s = c["seq"]
    past = c.get("past", 0)
    llama = c["family"] == "llama"
    g = torch.Generator().manual_seed(7)

    def w(*shape, scale=1.0):
        return (torch.rand(*shape, generator=g) * 2 - 1) * scale

    P = {}
    for name, (i, o) in {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d)}.items():
        P[name] = w(i, o, scale=d ** -0.5)
        P[name + "b"] = None if llama else w(o, scale=0.1)
    if llama:
        P["gate"], P["up"], P["down"] = w(d, f, scale=d ** -0.5), w(d, f, scale=d ** -0.5), w(f, d, scale=f ** -0.5)
    else:
        P["fc_in"], P["fc_inb"] = w(d, f, scale=d ** -0.5), w(f, scale=0.1)
        P["fc_out"], P["fc_outb"] = w(f, d, scale=f ** -0.5), w(d, scale=0.1)
    P["n1"], P["n2"] = 1 + w(d, scale=0.2), 1 + w(d, scale=0.2)
    P["n1b"], P["n2b"] = w(d, scale=0.1), w(d, scale=0.1)
    pos = torch.arange(past, past + s, dtype=torch.float64)[:, None]
    inv = 10000.0 ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    ang = torch.cat((pos * inv, pos * inv), dim=-1)
    cos, sin = ang.cos().float(), ang.sin().float()
    if c["family"] == "bert":
        mask = torch.zeros(1, 1, 1, s)
        mask[..., s - s // 8:] = -1e9
    else:
        mask = torch.triu(torch.full((s, past + s), -1e9), diagonal=past + 1)  # row i sees keys up to past + i
    return P, cos, sin, mask


def make_block(c, device="cpu", dtype=torch.float32):
    d, nh = c["hidden"], c["heads"]
    hd = d // nh
    s = c["seq"]
    llama = c["family"] == "llama"
    P, cos, sin, mask = block_tensors(c)
    eps = c["eps"]
    P = {k: (None if v is None else v.to(device=device, dtype=dtype)) for k, v in P.items()}
    cos, sin, mask = (t.to(device=device, dtype=dtype) for t in (cos, sin, mask))

    def linear(x, name):
        y = x @ P[name]
        return y if P.get(name + "b") is None else y + P[name + "b"]

    def norm(x, which):
        if llama:
            return rms_norm(x, P[which], eps)
        return F.layer_norm(x, (d,), P[which], P[which + "b"], eps)

    def attention(h, cache):
        b = h.shape[0]
        q = linear(h, "q").view(b, s, nh, hd).transpose(1, 2)
        k = linear(h, "k").view(b, s, nh, hd).transpose(1, 2)
        v = linear(h, "v").view(b, s, nh, hd).transpose(1, 2)
        if llama:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if cache is not None:  # the KV cache: past rows, then the new ones
            k = torch.cat((cache[0], k), dim=-2)
            v = torch.cat((cache[1], v), dim=-2)
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(hd)) + mask
        o = torch.softmax(scores, dim=-1) @ v
        return linear(o.transpose(1, 2).reshape(b, s, d), "o"), (k, v)

    def mlp(h):
        if llama:
            return linear(F.silu(linear(h, "gate")) * linear(h, "up"), "down")
        act = F.gelu(linear(h, "fc_in"), approximate="tanh" if c["family"] == "gpt2" else "none")
        return linear(act, "fc_out")

    def block(x, past_k=None, past_v=None):
        """y, or with a cache (y, present_k, present_v)."""
        cache = None if past_k is None else (past_k, past_v)
        if c["family"] == "bert":
            a, _ = attention(x, None)
            h1 = norm(a + x, "n1")
            return norm(mlp(h1) + h1, "n2")
        a, present = attention(norm(x, "n1"), cache)
        r1 = x + a
        y = r1 + mlp(norm(r1, "n2"))
        return y if cache is None else (y, present[0], present[1])

    return block


class Block(torch.nn.Module):
    """make_block as an nn.Module (without a KV cache): the same weights (same generator, same
    draw order), the same ops; weights are Parameters, the rotary tables and the mask are
    buffers. bench/torch_compile.py and bench/peers/cpu_peers.py build their blocks with it."""

    def __init__(self, c: dict):
        super().__init__()
        d, nh = c["hidden"], c["heads"]
        self.d, self.nh, self.hd, self.s = d, nh, d // nh, c["seq"]
        self.family, self.llama, self.eps = c["family"], c["family"] == "llama", c["eps"]
        P, cos, sin, mask = block_tensors(c)
        for k, v in P.items():
            if v is not None:
                self.register_parameter("p_" + k, torch.nn.Parameter(v, requires_grad=False))
        self.has = {k for k, v in P.items() if v is not None}
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", mask, persistent=False)

    def linear(self, x, name):
        y = x @ getattr(self, "p_" + name)
        return y + getattr(self, "p_" + name + "b") if (name + "b") in self.has else y

    def norm(self, x, which):
        if self.llama:
            return rms_norm(x, getattr(self, "p_" + which), self.eps)
        return F.layer_norm(x, (self.d,), getattr(self, "p_" + which), getattr(self, "p_" + which + "b"), self.eps)

    def attention(self, h):
        b, s, nh, hd = h.shape[0], self.s, self.nh, self.hd
        q = self.linear(h, "q").view(b, s, nh, hd).transpose(1, 2)
        k = self.linear(h, "k").view(b, s, nh, hd).transpose(1, 2)
        v = self.linear(h, "v").view(b, s, nh, hd).transpose(1, 2)
        if self.llama:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(hd)) + self.mask
        o = torch.softmax(scores, dim=-1) @ v
        return self.linear(o.transpose(1, 2).reshape(b, s, self.d), "o")

    def mlp(self, h):
        if self.llama:
            return self.linear(F.silu(self.linear(h, "gate")) * self.linear(h, "up"), "down")
        act = F.gelu(self.linear(h, "fc_in"), approximate="tanh" if self.family == "gpt2" else "none")
        return self.linear(act, "fc_out")

    def forward(self, x):
        if self.family == "bert":
            h1 = self.norm(self.attention(x) + x, "n1")
            return self.norm(self.mlp(h1) + h1, "n2")
        r1 = x + self.attention(self.norm(x, "n1"))
        return r1 + self.mlp(self.norm(r1, "n2"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama7b", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--past", type=int, default=0, help="rows of a KV cache before the seq new ones (llama, gpt2)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--mode", default=None, help="torch.compile's mode (e.g. reduce-overhead: CUDA graphs)")
    a = ap.parse_args()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    c = dict(PRESETS[a.preset])
    if a.seq:
        c["seq"] = a.seq
    if a.past < 0 or (a.past and c["family"] == "bert"):
        ap.error("--past takes L >= 0, for llama and gpt2 presets (BERT is an encoder)")
    c["past"] = a.past
    torch.set_num_threads(a.threads)
    block = make_block(c, a.device, dtype)
    if a.compile:
        block = torch.compile(block, mode=a.mode)
    x = (torch.rand(1, c["seq"], c["hidden"]) * 2 - 1).to(device=a.device, dtype=dtype)
    args = [x]
    if a.past:
        hd = c["hidden"] // c["heads"]
        args += [(torch.rand(1, c["heads"], a.past, hd) * 2 - 1).to(device=a.device, dtype=dtype) for _ in range(2)]
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(5 if a.compile else 2):  # reduce-overhead records its CUDA graph in these
            block(*args)
        sync()
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            block(*args)
            sync()
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps(dict(preset=a.preset, seq=c["seq"], past=a.past, threads=a.threads, repeats=a.repeats, device=a.device,
                          dtype=a.dtype, compiled=a.compile, mode=a.mode,
                          latency_ms=times[len(times) // 2] * 1e3, min_ms=times[0] * 1e3,
                          torch=torch.__version__)))


if __name__ == "__main__":
    main()
