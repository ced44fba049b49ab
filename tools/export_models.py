#!/usr/bin/python3
"""Exports the small end-to-end test models in tests/models/ with torch.onnx.export.

Run with Debian's python3 (torch 1.13 + onnx 1.12 from Debian: python3-torch, python3-onnx):

    /usr/bin/python3 tools/export_models.py [--out tests/models]

For every model and every opset in OPSETS it writes

    <out>/<name>_opset<k>/model.onnx
    <out>/<name>_opset<k>/test_data_set_0/input_<i>.pb    (f32, fixed seed)
    <out>/<name>_opset<k>/test_data_set_0/output_<i>.pb   (the same module run in float64 on the
                                                          same inputs, stored as f32)

so the references carry no f32 rounding of their own. The models are written the way the
upstream code writes them (GELU via nn.GELU, RMSNorm as x * rsqrt(mean(x^2) + eps) * w, RoPE
in rotate_half form, SwiGLU as silu(gate) * up), which is what the canonicalization passes
must recognize. Shapes are static (batch 1, seq 16, hidden 64) and reshapes use Python ints,
so the exported graphs hold no shape arithmetic.

A model that takes more than `x` (bert_layer's padding mask) lists its further inputs in
MODELS; they are written as input_1.pb, ... in the order given.

    /usr/bin/python3 tools/export_models.py --only gpt2_block bert_layer

exports only the named models and leaves the other directories as they are. In the project's
venv (tools/setup_venv.sh: a current torch), --dynamo exports with the torch.export based
exporter instead, as users call it (every setting at its default: its opset, the weights in
model.onnx.data beside the model), to <out>/<name>_dynamo/:

    ~/.cache/graphfuse/venv/bin/python tools/export_models.py --dynamo --only transformer_encoder_layer
"""
import argparse
import math
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper
import onnx

OPSETS = (13, 17)
SEQ = 16
HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS


def causal_mask(seq):
    """Additive mask: 0 on and below the diagonal, float32's lowest value above it (as HF does)."""
    m = torch.full((seq, seq), torch.finfo(torch.float32).min)
    return torch.triu(m, diagonal=1).reshape(1, 1, seq, seq)


class MlpGelu(nn.Module):
    """Linear -> GELU (erf form) -> Linear."""

    def __init__(self, d=HIDDEN, hidden=HIDDEN):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class AttentionLayerNorm(nn.Module):
    """Pre-norm causal self-attention block: x + Wo(softmax(QK^T/sqrt(d) + mask) V), LN first."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ):
        super().__init__()
        self.heads, self.hd, self.seq = heads, d // heads, seq
        self.ln = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.register_buffer("mask", causal_mask(seq))

    def forward(self, x):
        h = self.ln(x)
        q = self.q(h).reshape(1, self.seq, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).reshape(1, self.seq, self.heads, self.hd).transpose(1, 2)
        v = self.v(h).reshape(1, self.seq, self.heads, self.hd).transpose(1, 2)
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd) + self.mask
        p = torch.softmax(s, dim=-1)
        a = torch.matmul(p, v).transpose(1, 2).reshape(1, self.seq, self.heads * self.hd)
        return x + self.o(a)


class RMSNorm(nn.Module):
    """As in LLaMA's code: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(seq, dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    t = torch.arange(seq, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float().reshape(1, 1, seq, dim), emb.sin().float().reshape(1, 1, seq, dim)


class LlamaBlock(nn.Module):
    """LLaMA decoder layer: RMSNorm, RoPE causal attention, residual, RMSNorm, SwiGLU MLP, residual."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ, inter=172):
        super().__init__()
        self.heads, self.hd, self.seq = heads, d // heads, seq
        self.input_norm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_norm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)
        cos, sin = rope_tables(seq, self.hd)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", causal_mask(seq))
        with torch.no_grad():  # non-trivial norm weights, so a dropped weight multiply shows
            self.input_norm.weight.uniform_(0.5, 1.5)
            self.post_norm.weight.uniform_(0.5, 1.5)

    def heads_of(self, t):
        return t.reshape(1, self.seq, self.heads, self.hd).transpose(1, 2)

    def forward(self, x):
        h = self.input_norm(x)
        q, k, v = self.heads_of(self.q_proj(h)), self.heads_of(self.k_proj(h)), self.heads_of(self.v_proj(h))
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd) + self.mask
        p = F.softmax(s, dim=-1)
        a = torch.matmul(p, v).transpose(1, 2).reshape(1, self.seq, self.heads * self.hd)
        x = x + self.o_proj(a)
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def padding_mask(batch, seq, padded):
    """Additive key-padding mask [B,1,1,S]: 0 for kept keys, -1e9 for the last `padded` keys."""
    m = torch.zeros(batch, 1, 1, seq)
    m[..., seq - padded:] = -1e9
    return m


class SelfAttention(nn.Module):
    """Multi-head self-attention as GPT-2 and BERT write it: separate q/k/v projections with
    bias, heads split with view/transpose, softmax(QK^T / sqrt(d) + mask) V, heads merged,
    output projection with bias. The residual add is left to the caller."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ):
        super().__init__()
        self.heads, self.hd, self.seq = heads, d // heads, seq
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)

    def split(self, t):
        return t.view(1, self.seq, self.heads, self.hd).transpose(1, 2)

    def forward(self, h, mask):
        q, k, v = self.split(self.q_proj(h)), self.split(self.k_proj(h)), self.split(self.v_proj(h))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        p = torch.softmax(s, dim=-1)
        a = torch.matmul(p, v).transpose(1, 2).contiguous().view(1, self.seq, self.heads * self.hd)
        return self.o_proj(a)


def randomize_layer_norms(module):
    """Non-trivial LayerNorm scales and shifts, so a dropped weight multiply or bias add shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)


class Gpt2Block(nn.Module):
    """GPT-2 decoder layer (pre-norm): x + attn(ln_1(x)) with a causal mask, then
    r + fc_out(gelu_tanh(fc_in(ln_2(r))))."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ, ffn=4 * HIDDEN, attention=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = (attention or SelfAttention)(d, heads, seq)
        self.ln_2 = nn.LayerNorm(d)
        self.fc_in = nn.Linear(d, ffn)
        self.fc_out = nn.Linear(ffn, d)
        self.register_buffer("mask", causal_mask(seq))
        randomize_layer_norms(self)

    def forward(self, x):
        r = x + self.attn(self.ln_1(x), self.mask)
        return r + self.fc_out(F.gelu(self.fc_in(self.ln_2(r)), approximate="tanh"))


class SelfAttentionWhere(SelfAttention):
    """SelfAttention masked as Hugging Face's GPT-2 does it: a bool causal buffer, sliced to the
    sequence, selects the scores with torch.where (masked keys take float32's lowest value),
    then the additive attention_mask (padding) is added."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ):
        super().__init__(d, heads, seq)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq))

    def forward(self, h, attention_mask):
        q, k, v = self.split(self.q_proj(h)), self.split(self.k_proj(h)), self.split(self.v_proj(h))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        causal = self.bias[:, :, : self.seq, : self.seq]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
        w = torch.where(causal, w, mask_value) + attention_mask
        p = torch.softmax(w, dim=-1)
        a = torch.matmul(p, v).transpose(1, 2).contiguous().view(1, self.seq, self.heads * self.hd)
        return self.o_proj(a)


class Gpt2WhereBlock(Gpt2Block):
    """Gpt2Block with SelfAttentionWhere: the causal mask is a bool tensor applied by Where, and
    the padding mask (the second input) is added after it."""

    def __init__(self):
        super().__init__(attention=SelfAttentionWhere)

    def forward(self, x, mask):
        r = x + self.attn(self.ln_1(x), mask)
        return r + self.fc_out(F.gelu(self.fc_in(self.ln_2(r)), approximate="tanh"))


class BertLayer(nn.Module):
    """BERT encoder layer (post-norm): h = ln_1(attn(x, mask) + x) with the padding mask given
    as the second input, then ln_2(fc_out(gelu(fc_in(h))) + h) with GELU in erf form."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ, ffn=4 * HIDDEN):
        super().__init__()
        self.attn = SelfAttention(d, heads, seq)
        self.ln_1 = nn.LayerNorm(d)
        self.fc_in = nn.Linear(d, ffn)
        self.fc_out = nn.Linear(ffn, d)
        self.ln_2 = nn.LayerNorm(d)
        randomize_layer_norms(self)

    def forward(self, x, mask):
        h = self.ln_1(self.attn(x, mask) + x)
        return self.ln_2(self.fc_out(F.gelu(self.fc_in(h))) + h)


class Conv1D(nn.Module):
    """transformers' Conv1D (GPT-2's linear layer): weight [nx, nf], y = addmm(bias, x.view(-1, nx), W)
    viewed back to x's leading dims."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))
        nn.init.normal_(self.weight, std=0.02)
        nn.init.normal_(self.bias, std=0.02)  # non-zero, so a dropped bias add shows

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Gpt2Conv1DBlock(nn.Module):
    """GPT-2 block written as transformers' GPT2Block writes it: Conv1D layers, c_attn's output
    split into q, k, v with .split(embed, dim=2), heads by view + permute, scores divided by
    sqrt(d) given as torch.full, the causal mask applied with torch.where over a bool tril buffer
    and finfo.min, heads merged by permute + contiguous + view, gelu_new (tanh form written
    out), LayerNorms and residuals (dropout left out: eval)."""

    def __init__(self, d=HIDDEN, heads=HEADS, seq=SEQ, ffn=4 * HIDDEN):
        super().__init__()
        self.embed, self.heads, self.hd = d, heads, d // heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(ffn, d)
        self.mlp_c_proj = Conv1D(d, ffn)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq))
        randomize_layer_norms(self)

    def split_heads(self, t):
        return t.view(t.size()[:-1] + (self.heads, self.hd)).permute(0, 2, 1, 3)

    def merge_heads(self, t):
        t = t.permute(0, 2, 1, 3).contiguous()
        return t.view(t.size()[:-2] + (self.heads * self.hd,))

    @staticmethod
    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    def attn(self, h):
        query, key, value = self.c_attn(h).split(self.embed, dim=2)
        q, k, v = self.split_heads(query), self.split_heads(key), self.split_heads(value)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        ql, kl = q.size(-2), k.size(-2)
        causal = self.bias[:, :, kl - ql: kl, :kl]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
        w = torch.where(causal, w, mask_value)
        p = F.softmax(w, dim=-1)
        return self.c_proj(self.merge_heads(torch.matmul(p, v)))

    def forward(self, x):
        r = self.attn(self.ln_1(x)) + x
        return r + self.mlp_c_proj(self.gelu_new(self.c_fc(self.ln_2(r))))


class TransformerEncoderLayer(nn.Module):
    """torch.nn.TransformerEncoderLayer(d_model=HIDDEN, nhead=HEADS, dim_feedforward=128,
    dropout=0) as constructed by default (batch_first=False: x is (S, B, E); post-norm; ReLU):
    nn.MultiheadAttention's packed in-projection chunked into q, k, v, attention over
    (B*H, S, d) with q scaled before the scores. Batch 2, so that the (S, B*H, d) head layout is
    not a mere reshape. The default layout is not the fast path, so the export is the standard
    decomposition (asserted in export)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=HIDDEN, nhead=HEADS, dim_feedforward=128, dropout=0.0)
        randomize_layer_norms(self)
        with torch.no_grad():  # non-zero biases (MultiheadAttention starts them at 0)
            self.layer.self_attn.in_proj_bias.uniform_(-0.1, 0.1)
            self.layer.self_attn.out_proj.bias.uniform_(-0.1, 0.1)

    def forward(self, x):
        return self.layer(x)


MODELS = {
    "mlp_gelu": (MlpGelu, (1, SEQ, HIDDEN)),
    "attention_layernorm": (AttentionLayerNorm, (1, SEQ, HIDDEN)),
    "llama_block": (LlamaBlock, (1, SEQ, HIDDEN)),
    # New models go at the end: a model's seed follows its position here.
    "gpt2_block": (Gpt2Block, (1, SEQ, HIDDEN)),
    "bert_layer": (BertLayer, (1, SEQ, HIDDEN), {"mask": padding_mask(1, SEQ, SEQ // 8)}),
    "gpt2_where_block": (Gpt2WhereBlock, (1, SEQ, HIDDEN), {"mask": padding_mask(1, SEQ, SEQ // 8)}),
    "gpt2_conv1d_block": (Gpt2Conv1DBlock, (1, SEQ, HIDDEN)),
    "transformer_encoder_layer": (TransformerEncoderLayer, (SEQ, 2, HIDDEN)),
}


def save_tensor(path, array, name):
    t = numpy_helper.from_array(array, name=name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def export(name, cls, shape, opset, out_root, seed, extra_inputs=None):
    """`extra_inputs`: {name: tensor} of model inputs after `x`, used as given (not random).
    `opset` None: the dynamo exporter with its defaults, to <name>_dynamo."""
    extra_inputs = extra_inputs or {}
    torch.manual_seed(seed)
    model = cls().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))
    inputs = (x,) + tuple(extra_inputs.values())
    names = ["x"] + list(extra_inputs)
    d = os.path.join(out_root, f"{name}_opset{opset}" if opset else f"{name}_dynamo")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, "test_data_set_0"))
    path = os.path.join(d, "model.onnx")
    with torch.no_grad():
        if opset:
            torch.onnx.export(model, inputs, path, opset_version=opset, input_names=names, output_names=["y"],
                              do_constant_folding=True)
        else:
            torch.onnx.export(model, inputs, path, dynamo=True, input_names=names, output_names=["y"])
        ref = model.double()(*(t.double() for t in inputs)).float()
    m = onnx.load(path)
    onnx.checker.check_model(path)
    custom = sorted({n.op_type for n in m.graph.node if n.domain not in ("", "ai.onnx")})
    assert not custom, f"{path}: ops outside the ONNX domain (a fused fast path?): {custom}"
    graph_inputs = [i.name for i in m.graph.input]
    assert graph_inputs == names, f"{path}: inputs {graph_inputs}, expected {names}"
    for i, (n, t) in enumerate(zip(names, inputs)):
        save_tensor(os.path.join(d, "test_data_set_0", f"input_{i}.pb"), t.numpy(), n)
    save_tensor(os.path.join(d, "test_data_set_0", "output_0.pb"), ref.numpy(), "y")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("model.onnx"))
    assert size < 1 << 20, f"{path} is {size} bytes"
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"{d}: {size} bytes, {len(m.graph.node)} nodes: {' '.join(ops)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "models"))
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), metavar="NAME",
                    help=f"export only these models (of: {', '.join(MODELS)})")
    ap.add_argument("--dynamo", action="store_true",
                    help="the dynamo exporter at its defaults (needs torch 2.x: the project's venv)")
    args = ap.parse_args()
    for i, (name, (cls, shape, *extra)) in enumerate(MODELS.items()):
        if args.only and name not in args.only:
            continue
        for opset in [None] if args.dynamo else OPSETS:
            export(name, cls, shape, opset, args.out, seed=1234 + 10 * i, extra_inputs=extra[0] if extra else None)


if __name__ == "__main__":
    main()
