#!/usr/bin/env python3
"""Exports small Hugging Face transformers models to ONNX, the way users export them.

The models are transformers' own classes (LlamaForCausalLM, GPT2LMHeadModel, BertModel, ...)
built from small random configs (hidden 64, 4 heads, 2 layers, vocab 192, seeded), exported
with torch.onnx.export by both exporters:

    ts        the TorchScript exporter (dynamo=False), opset 17
    dynamo    the torch.export based exporter (dynamo=True), at its default opset
    dynamo23  the same at opset 23 (24: dynamo24), where scaled_dot_product_attention becomes
              ONNX's own Attention op (sdpa exports only)

with the attention transformers writes by default (attn_implementation "sdpa", the
directories named <model>_sdpa_<exporter>_<variant>) and with its "eager" attention
(<model>_<exporter>_<variant>),

each in up to three variants:

    static   batch 1, seq 8; decoders take input_ids only (called as model(input_ids), so
             the causal mask and the positions come from shapes alone), encoders
             input_ids, attention_mask (and BERT's token_type_ids)
    dynamic  batch and sequence symbolic ("batch", "seq"); decoders take input_ids and
             attention_mask; one data set is left-padded
    kv       decoders only: input_ids, attention_mask (past + new), position_ids and
             past_key_values.<i>.key / .value in, logits and present.<i>.key / .value out;
             batch, seq and past_seq symbolic (the TorchScript exporter names the mask's
             length "total_seq"; the dynamo exporter derives its own names, e.g.
             "past_seq + seq" for the presents)

Layout, for every exported directory:

    <out>/<dir>/model.onnx      (weights inside; the sdpa dynamo exports as the exporter writes
                                 them by default: the weights in model.onnx.data beside it)
    <out>/<dir>/test_data_set_<k>/input_<i>.pb, output_<i>.pb

Each .pb is a serialized onnx TensorProto named after the graph input / output it belongs to,
numbered in the graph's input / output order. The reference outputs come from a float64 copy
of the same module on the same inputs, stored as float32 (from the float32 module instead
where float64 overflows; see reference(), recorded per data set). <out>/MANIFEST.json records, per
directory, the model class and config, exporter, versions, opset, inputs and outputs with
their symbolic dims, the data set shapes, the op types in the graph and which graph inputs
feed the shape operands of Reshape / Expand / Slice / Range / ...; exports that failed are
recorded there with their error.

Run it in the venv made by tools/setup_venv.sh:

    bash tools/setup_venv.sh                        # once; ~/.cache/graphfuse/venv by default
    ~/.cache/graphfuse/venv/bin/python tools/export_hf_corpus.py [--out tests/models/hf] [--check-ort]

    # only some models, exporters or variants (other directories and their MANIFEST entries
    # are kept as they are):
    ~/.cache/graphfuse/venv/bin/python tools/export_hf_corpus.py --only llama gpt2 \
        --exporters ts --variants static dynamic

--check-ort runs every exported model in onnxruntime on its data sets and records the max
abs error against the reference in the MANIFEST. Everything is seeded, so a rerun with the
same pinned versions writes the same tensors.
"""
import argparse
import contextlib
import copy
import inspect
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import transformers
from onnx import numpy_helper

SEED = 1234
TS_OPSET = 17
VOCAB = 192  # distinct from HIDDEN and INTER, so a wrong axis shows
HIDDEN = 64
HEADS = 4
LAYERS = 2
INTER = 128
MAX_POS = 128

# Small shared dims of every config; each model below adds or renames what it needs.
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  max_position_embeddings=MAX_POS, tie_word_embeddings=False)

# name -> (transformers config class, model class, config kwargs, kind)
# kind "decoder": a causal LM (logits out, kv variant); "encoder": a BERT-like encoder.
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(LLAMA_LIKE, num_key_value_heads=HEADS, rms_norm_eps=1e-6), "decoder"),
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM",
                  dict(LLAMA_LIKE, num_key_value_heads=2, rms_norm_eps=1e-6), "decoder"),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(LLAMA_LIKE, num_key_value_heads=2, rms_norm_eps=1e-6, sliding_window=None),
                "decoder"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(LLAMA_LIKE, num_key_value_heads=2, rms_norm_eps=1e-6, use_sliding_window=False),
              "decoder"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_positions=MAX_POS, n_embd=HIDDEN, n_layer=LAYERS,
                  n_head=HEADS, n_inner=INTER, bos_token_id=0, eos_token_id=0), "decoder"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(LLAMA_LIKE, rotary_pct=0.25), "decoder"),
    "bert": ("BertConfig", "BertModel",
             dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, intermediate_size=INTER,
                  max_position_embeddings=MAX_POS, type_vocab_size=2), "encoder"),
    "roberta": ("RobertaConfig", "RobertaModel",
                # RoBERTa's positions start after padding_idx (1), hence MAX_POS + 2.
                dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, intermediate_size=INTER,
                     max_position_embeddings=MAX_POS + 2, type_vocab_size=1), "encoder"),
    # The attention variants of today's decoders and encoders, each in a small model of its own
    # (exported as users do: sdpa, the dynamo exporter; see VARIANT_PLAN).
    "gptj": ("GPTJConfig", "GPTJForCausalLM",  # interleaved partial rotary, parallel attention + MLP
             dict(vocab_size=VOCAB, n_positions=MAX_POS, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                  n_inner=INTER, rotary_dim=8, bos_token_id=0, eos_token_id=0,
                  tie_word_embeddings=False), "decoder"),
    "phi": ("PhiConfig", "PhiForCausalLM",  # partial rotary, q / k LayerNorm, parallel attention + MLP
            dict(LLAMA_LIKE, partial_rotary_factor=0.5, qk_layernorm=True), "decoder"),
    "falcon_mqa": ("FalconConfig", "FalconForCausalLM",  # one KV head, parallel attention + MLP
                   dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, multi_query=True, parallel_attn=True,
                        new_decoder_architecture=False, alibi=False, bias=False,
                        max_position_embeddings=MAX_POS, bos_token_id=0, eos_token_id=0), "decoder"),
    "mpt": ("MptConfig", "MptForCausalLM",  # ALiBi biases (added to the scores as a tensor)
            dict(vocab_size=VOCAB, d_model=HIDDEN, n_heads=HEADS, n_layers=LAYERS, expansion_ratio=2,
                 max_seq_len=MAX_POS), "decoder"),
    "bloom": ("BloomConfig", "BloomForCausalLM",  # ALiBi biases (baddbmm on [B*H, S, T] scores)
              dict(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS), "decoder"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",  # logit soft-capping, sliding window
               dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=16, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, sliding_window=4, query_pre_attn_scalar=16),
               "decoder"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",  # q / k RMSNorm per head before RoPE
              dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6), "decoder"),
    "olmo": ("OlmoConfig", "OlmoForCausalLM",  # clipped q, k, v
             dict(LLAMA_LIKE, num_key_value_heads=HEADS, clip_qkv=0.1), "decoder"),
    "mistral_swa": ("MistralConfig", "MistralForCausalLM",  # sliding-window mask
                    dict(LLAMA_LIKE, num_key_value_heads=2, rms_norm_eps=1e-6, sliding_window=4),
                    "decoder"),
    "llama_mqa": ("LlamaConfig", "LlamaForCausalLM",  # multi-query attention (one KV head)
                  dict(LLAMA_LIKE, num_key_value_heads=1, rms_norm_eps=1e-6), "decoder"),
    "t5": ("T5Config", "T5EncoderModel",  # relative-position biases, given as a tensor
           dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=16, d_ff=INTER, num_layers=LAYERS,
                num_heads=HEADS, relative_attention_num_buckets=8,
                relative_attention_max_distance=16), "encoder_hidden"),
}

# What is exported of each variant model when no --exporters / --variants / --attn is given:
# the default export (sdpa, the dynamo exporter), with a cache for decoders, and dynamic shapes.
VARIANT_PLAN = {name: [("dynamo", "kv" if MODELS[name][3] == "decoder" else "dynamic", "sdpa"),
                       ("dynamo", "dynamic", "sdpa")]
                for name in ("gptj", "phi", "falcon_mqa", "mpt", "bloom", "gemma2", "qwen3", "olmo",
                             "mistral_swa", "llama_mqa")}
# T5's encoder: the dynamo exporter fails on it (decomposing its relative-position buckets).
VARIANT_PLAN["t5"] = [("ts", "dynamic", "sdpa"), ("ts", "static", "sdpa")]

# dynamo23 / dynamo24: the dynamo exporter at opset 23 / 24, where scaled_dot_product_attention
# becomes ONNX's own Attention op (sdpa exports only).
EXPORTERS = ("ts", "dynamo", "dynamo23", "dynamo24")
ATTN = ("sdpa", "eager")
VARIANTS = ("static", "dynamic", "kv")


# ----------------------------------------------------------------------------------------
# Models and the flat-tensor wrappers that are exported.

def build_model(name, attn="sdpa"):
    """The transformers model `name` with seeded random weights, in eval mode, float32, its
    attention written by `attn` (transformers' default, "sdpa" where the class has it, or
    "eager")."""
    config_cls, model_cls, kwargs, _ = MODELS[name]
    config = getattr(transformers, config_cls)(**kwargs)
    if attn != "sdpa":  # "sdpa" is transformers' default, which picks eager where a class has no sdpa
        config._attn_implementation = attn
    torch.manual_seed(SEED)
    model = getattr(transformers, model_cls)(config)
    # Norm weights and all biases start at 1 / 0; random ones make the reference sensitive
    # to every parameter (and keep the TorchScript exporter from merging equal initializers).
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname.lower() or "ln_" in pname or pname.endswith(".bias"):
                p.copy_(p + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def cache_layers(cache):
    """(keys, values) of each layer of a transformers cache object."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


class CausalLM(nn.Module):
    """input_ids, attention_mask -> logits. Called as a user calls the model (use_cache left
    at its default: the cache it builds is not an output, so the export drops it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class CausalLMStatic(nn.Module):
    """input_ids -> logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


class CausalLMWithPast(nn.Module):
    """input_ids, attention_mask, position_ids, past k/v of each layer (flat) ->
    logits, present k/v of each layer (flat). The flat pasts become a DynamicCache inside."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=True)
        # The model updates `cache` in place (it is also out.cache).
        flat = [out.logits]
        for k, v in cache_layers(cache):
            flat += [k, v]
        return tuple(flat)


class Encoder(nn.Module):
    """input_ids, attention_mask [, token_type_ids] -> last_hidden_state, pooler_output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


class EncoderNoTypes(Encoder):
    """input_ids, attention_mask -> last_hidden_state, pooler_output (RoBERTa: one token type)."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids, attention_mask)


class EncoderHidden(nn.Module):
    """input_ids, attention_mask -> last_hidden_state (an encoder without a pooler: T5's)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def kv_shape(config, batch, past):
    kv_heads = (getattr(config, "num_key_value_heads", None)
                or (1 if getattr(config, "multi_query", False) else None) or config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (batch, kv_heads, past, head_dim)


# ----------------------------------------------------------------------------------------
# Inputs.

def left_padded_mask(batch, length, pad_row, pads):
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[pad_row, :pads] = 0
    return mask


def positions_from_mask(mask, seq):
    """position_ids for the last `seq` tokens, as generate() computes them from the mask."""
    pos = mask.cumsum(-1) - 1
    pos = pos.masked_fill(mask == 0, 1)
    return pos[:, -seq:].contiguous()


class Spec:
    """What one exported variant takes and gives: input / output names with their symbolic
    dims, the wrapper module, the example inputs it is exported with and its data sets."""

    def __init__(self, module, inputs, outputs, example, datasets):
        # eval() on the wrapper too: the TorchScript exporter restores the wrapper's own
        # training flag, recursively, when it is done.
        self.module = module.eval()
        self.varargs = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(module.forward).parameters.values())
        self.inputs = inputs      # [(name, {axis: dim name})]
        self.outputs = outputs    # [(name, {axis: dim name})]
        self.example = example    # {input name: tensor}
        self.datasets = datasets  # [(description, {input name: tensor})]


def make_spec(name, model, variant, rng):
    _, _, _, kind = MODELS[name]
    config = model.config

    def ids(batch, seq):
        return torch.randint(0, VOCAB, (batch, seq), generator=rng, dtype=torch.int64)

    def feeds(batch, seq, mask=None, types=False):
        d = {"input_ids": ids(batch, seq)}
        if mask is not False:
            d["attention_mask"] = mask if mask is not None else torch.ones(batch, seq, dtype=torch.int64)
        if types:
            d["token_type_ids"] = torch.randint(0, 2, (batch, seq), generator=rng, dtype=torch.int64)
        return d

    bs = {0: "batch", 1: "seq"}
    if kind in ("encoder", "encoder_hidden"):
        types = name == "bert"
        module = Encoder(model) if types else EncoderNoTypes(model) if kind == "encoder" else EncoderHidden(model)
        in_names = ["input_ids", "attention_mask"] + (["token_type_ids"] if types else [])
        outputs = [("last_hidden_state", {0: "batch", 1: "seq"})]
        if kind == "encoder":
            outputs.append(("pooler_output", {0: "batch"}))
        if variant == "static":
            sets = [("1x8", feeds(1, 8, types=types))]
            return Spec(module, [(n, {}) for n in in_names], [(n, {}) for n, _ in outputs],
                        sets[0][1], sets)
        if variant == "dynamic":
            example = feeds(2, 5, types=types)
            sets = [("1x1", feeds(1, 1, types=types)), ("1x7", feeds(1, 7, types=types)),
                    ("2x5", feeds(2, 5, types=types)),
                    ("2x6 left-padded row 1", feeds(2, 6, left_padded_mask(2, 6, 1, 2), types))]
            return Spec(module, [(n, bs) for n in in_names], outputs, example, sets)
        return None

    if variant == "static":
        sets = [("1x8", feeds(1, 8, mask=False))]
        return Spec(CausalLMStatic(model), [("input_ids", {})], [("logits", {})], sets[0][1], sets)
    if variant == "dynamic":
        sets = [("1x1", feeds(1, 1)), ("1x7", feeds(1, 7)), ("2x5", feeds(2, 5)),
                ("2x6 left-padded row 1", feeds(2, 6, left_padded_mask(2, 6, 1, 2)))]
        return Spec(CausalLM(model), [("input_ids", bs), ("attention_mask", bs)],
                    [("logits", {0: "batch", 1: "seq"})], feeds(2, 5), sets)

    # kv: past of length past_seq, `seq` new tokens; the mask covers past + new.
    def kv_feeds(batch, past, seq, mask=None):
        mask = mask if mask is not None else torch.ones(batch, past + seq, dtype=torch.int64)
        d = {"input_ids": ids(batch, seq), "attention_mask": mask,
             "position_ids": positions_from_mask(mask, seq)}
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
        for i in range(config.num_hidden_layers):
            for kv in ("key", "value"):
                d[f"past_key_values.{i}.{kv}"] = torch.randn(kv_shape(config, batch, past), generator=g)
        return d

    in_names = [("input_ids", {0: "batch", 1: "seq"}),
                ("attention_mask", {0: "batch", 1: "total_seq"}),
                ("position_ids", {0: "batch", 1: "seq"})]
    outputs = [("logits", {0: "batch", 1: "seq"})]
    for i in range(config.num_hidden_layers):
        for kv in ("key", "value"):
            in_names.append((f"past_key_values.{i}.{kv}", {0: "batch", 2: "past_seq"}))
            outputs.append((f"present.{i}.{kv}", {0: "batch", 2: "total_seq"}))
    sets = [("decode: 1 new on past 5", kv_feeds(1, 5, 1)),
            ("chunk: 3 new on past 4", kv_feeds(1, 4, 3)),
            ("batch 2: 1 new on past 6, row 1 left-padded by 2",
             kv_feeds(2, 6, 1, left_padded_mask(2, 7, 1, 2)))]
    return Spec(CausalLMWithPast(model), in_names, outputs, kv_feeds(2, 4, 3), sets)


# ----------------------------------------------------------------------------------------
# Export.

def call(module, feeds, names):
    with torch.no_grad():
        out = module(*[feeds[n] for n in names])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def export_ts(spec, path):
    in_names = [n for n, _ in spec.inputs]
    out_names = [n for n, _ in spec.outputs]
    dynamic_axes = {n: dict(d) for n, d in spec.inputs + spec.outputs if d}
    args = tuple(spec.example[n] for n in in_names)
    torch.onnx.export(spec.module, args, path, dynamo=False, opset_version=TS_OPSET,
                      input_names=in_names, output_names=out_names,
                      dynamic_axes=dynamic_axes or None, do_constant_folding=True)


def export_dynamo(spec, path, defaults=False, opset=None):
    in_names = [n for n, _ in spec.inputs]
    out_names = [n for n, _ in spec.outputs]
    args = tuple(spec.example[n] for n in in_names)
    dims = {}

    def dim(dname):
        if dname not in dims:
            dims[dname] = torch.export.Dim(dname.replace(".", "_"), min=1, max=MAX_POS)
        return dims[dname]

    dynamic_shapes = None
    if any(d for _, d in spec.inputs):
        # total_seq = past_seq + seq is derived; torch.export finds that relation itself.
        per_input = [{a: (torch.export.Dim.AUTO if dn == "total_seq" else dim(dn)) for a, dn in d.items()} or None
                     for _, d in spec.inputs]
        # forward(*past) takes the past tensors as one tuple argument.
        fixed = len(inspect.signature(spec.module.forward).parameters) - (1 if spec.varargs else 0)
        dynamic_shapes = tuple(per_input[:fixed]) + ((tuple(per_input[fixed:]),) if spec.varargs else ())
    if defaults:
        # As users call it: the weights go to model.onnx.data beside the model (the default).
        torch.onnx.export(spec.module, args, path, dynamo=True, input_names=in_names,
                          output_names=out_names, dynamic_shapes=dynamic_shapes,
                          **({"opset_version": opset} if opset else {}))
        return
    program = torch.onnx.export(spec.module, args, dynamo=True, input_names=in_names,
                                output_names=out_names, dynamic_shapes=dynamic_shapes,
                                external_data=False)
    program.save(path, external_data=False)


# ----------------------------------------------------------------------------------------
# Writing data sets and describing graphs.

@contextlib.contextmanager
def quiet():
    """Silences warnings and everything written to stdout / stderr, the C++ side's included
    (the TorchScript exporter prints the whole graph when it fails)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


STRIPPED_METADATA = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node")


def strip_node_metadata(model):
    """Drops the dynamo exporter's per-node Python stack traces and FX node text: the traces
    name this machine's paths (a rerun elsewhere would differ), and the two are half of the
    node metadata, which is a third of the file. The module scopes and class hierarchy are
    kept as exported."""
    nodes = list(all_nodes(model.graph)) + [n for fn in model.functions for n in fn.node]
    for node in nodes:
        keep = [p for p in node.metadata_props if p.key not in STRIPPED_METADATA]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)


def save_tensor(path, array, name):
    t = numpy_helper.from_array(np.ascontiguousarray(array), name=name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def to_numpy(t):
    t = t.detach()
    if t.dtype == torch.float64:
        t = t.float()
    return t.numpy()


def float64_copy(module, feeds):
    m64 = copy.deepcopy(module).double()
    f64 = {n: (t.double() if t.is_floating_point() else t) for n, t in feeds.items()}
    return m64, f64


def reference(module, feeds, in_names, out_names):
    """The reference outputs {name: tensor} of `module` on `feeds` and the precision they were
    computed in: a float64 copy of the module, or float32 where float64 gives a non-finite
    value that float32 does not. That happens in rows whose every key is masked: the models
    add finfo(float64).min to the scores and then take the softmax in float32, where that
    is -inf, so the row becomes NaN; in float32 the row stays finite (a uniform softmax)."""
    with quiet():
        m64, f64 = float64_copy(module, feeds)
        out64 = call(m64, f64, in_names)
        out32 = call(module, feeds, in_names)
    bad = any(bool((~torch.isfinite(a) & torch.isfinite(b)).any())
              for a, b in zip(out64, out32) if a.is_floating_point())
    return dict(zip(out_names, out32 if bad else out64)), ("float32" if bad else "float64")


def value_info_dims(vi):
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        dims.append(d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?"))
    return dims


def all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            for g in attr.graphs:
                yield from all_nodes(g)


def op_types(model):
    """{"op": count} over the main graph, its subgraphs and local functions; ops of other
    domains as "domain::op"."""
    counts = {}

    def add(node):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1

    for node in all_nodes(model.graph):
        add(node)
    for fn in model.functions:
        for node in fn.node:
            add(node)
    return dict(sorted(counts.items()))


# Operand positions that are shapes, indices or sizes rather than data.
SHAPE_OPERANDS = {
    "Reshape": [1], "Expand": [1], "Tile": [1], "Range": [0, 1, 2], "ConstantOfShape": [0],
    "Slice": [1, 2, 3, 4], "Squeeze": [1], "Unsqueeze": [1], "Pad": [1, 3], "Split": [1],
    "TopK": [1], "OneHot": [1], "Resize": [1, 2, 3], "ReduceSum": [1], "ReduceMean": [1],
    "ReduceMax": [1], "ReduceMin": [1], "Trilu": [1],
}


def shape_dependencies(model):
    """For each op kind in SHAPE_OPERANDS, which graph inputs its shape operands depend on:
    through their shape only ("shape"), or through their values ("value"). Operands that are
    constants after folding depend on nothing and are not listed."""
    graph = model.graph
    producer = {}
    for node in graph.node:
        for o in node.output:
            producer[o] = node
    inputs = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    memo = {}

    def deps(tensor):
        """{(graph input, "shape" | "value")} that the value of `tensor` depends on."""
        if tensor in memo:
            return memo[tensor]
        memo[tensor] = set()
        if tensor in inputs:
            result = {(tensor, "value")}
        elif tensor not in producer:
            result = set()
        else:
            node = producer[tensor]
            result = set()
            if node.op_type in ("Shape", "Size"):
                result = {(name, "shape") for name, _ in deps(node.input[0])}
            else:
                for t in node.input:
                    if t:
                        result |= deps(t)
        memo[tensor] = result
        return result

    out = {}
    for node in graph.node:
        positions = SHAPE_OPERANDS.get(node.op_type)
        if not positions:
            continue
        for p in positions:
            if p < len(node.input) and node.input[p]:
                for name, how in deps(node.input[p]):
                    out.setdefault(node.op_type, set()).add(f"{how} of {name}")
    return {op: sorted(v) for op, v in sorted(out.items())}


def run_ort(path, datasets):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    errs = []
    for feeds, refs in datasets:
        got = sess.run(None, feeds)
        errs.append(max(float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
                        if r.size else 0.0 for g, r in zip(got, refs)))
    return errs


def export_one(name, exporter, variant, attn, out_root, check_ort):
    """Exports one directory; returns its MANIFEST entry (None when the variant does not apply)."""
    if attn == "eager" and exporter.startswith("dynamo") and exporter != "dynamo":
        return None  # eager attention writes no Attention op: the opset-23 exports are sdpa's
    torch.manual_seed(SEED)
    rng = torch.Generator().manual_seed(SEED + hash_name(f"{name}/{variant}"))
    model = build_model(name, attn)
    spec = make_spec(name, model, variant, rng)
    if spec is None:
        return None
    print(f"{name} {attn} {exporter} {variant}", flush=True)
    config_cls, model_cls, kwargs, _ = MODELS[name]
    dirname = f"{name}_{exporter}_{variant}" if attn == "eager" else f"{name}_{attn}_{exporter}_{variant}"
    external = attn != "eager" and exporter.startswith("dynamo")  # the dynamo exporter's default: weights outside
    d = os.path.join(out_root, dirname)
    entry = {
        "model_class": model_cls, "config_class": config_cls, "config": kwargs,
        "attn_implementation": model.config._attn_implementation, "exporter": exporter, "variant": variant,
        "external_data": external,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "onnx": onnx.__version__,
    }
    if exporter == "dynamo":
        import onnxscript
        entry["onnxscript"] = onnxscript.__version__
        entry["stripped_node_metadata"] = list(STRIPPED_METADATA)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    path = os.path.join(d, "model.onnx")
    try:
        with quiet():
            if exporter == "ts":
                export_ts(spec, path)
            else:
                export_dynamo(spec, path, defaults=external, opset=int(exporter[6:]) if exporter[6:] else None)
        m = onnx.load(path)
        strip_node_metadata(m)
        if external:
            # The weights were read in; they are written out again, to one file as the exporter
            # wrote them (onnx appends to an existing file).
            os.remove(path + ".data")
            onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                      location="model.onnx.data", size_threshold=1024)
        else:
            onnx.save(m, path)
        onnx.checker.check_model(path)
    except Exception as e:  # noqa: BLE001 -- any exporter failure is recorded, not fatal
        shutil.rmtree(d, ignore_errors=True)
        msg = f"{type(e).__name__}: {e}"
        entry["error"] = msg[:4000]
        entry["traceback_tail"] = traceback.format_exc()[-3000:]
        print(f"  FAILED {dirname}: {msg.splitlines()[0][:300] if msg else type(e).__name__}")
        return dirname, entry
    for f in os.listdir(d):
        if f != "model.onnx" and not (external and f == "model.onnx.data"):
            raise RuntimeError(f"{dirname}: the exporter wrote {f} next to model.onnx")

    g_inputs = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    g_outputs = [o.name for o in m.graph.output]
    spec_in = [n for n, _ in spec.inputs]
    spec_out = [n for n, _ in spec.outputs]
    unknown = [n for n in g_inputs if n not in spec_in]
    if unknown or any(o not in spec_out for o in g_outputs):
        raise RuntimeError(f"{dirname}: graph inputs {g_inputs} / outputs {g_outputs} are not among "
                           f"{spec_in} / {spec_out}")
    entry["opset"] = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    other = {o.domain: o.version for o in m.opset_import if o.domain not in ("", "ai.onnx")}
    if other:
        entry["other_opsets"] = other
    entry["dropped_inputs"] = [n for n in spec_in if n not in g_inputs]
    entry["inputs"] = [{"name": i.name, "dtype": onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type),
                        "shape": value_info_dims(i)} for i in m.graph.input if i.name in g_inputs]
    entry["outputs"] = [{"name": o.name, "dtype": onnx.TensorProto.DataType.Name(o.type.tensor_type.elem_type),
                         "shape": value_info_dims(o)} for o in m.graph.output]

    ort_sets = []
    entry["data_sets"] = []
    for k, (desc, feeds) in enumerate(spec.datasets):
        refs, precision = reference(spec.module, feeds, spec_in, spec_out)
        sd = os.path.join(d, f"test_data_set_{k}")
        os.makedirs(sd)
        for i, n in enumerate(g_inputs):
            save_tensor(os.path.join(sd, f"input_{i}.pb"), feeds[n].numpy(), n)
        ref_np = [to_numpy(refs[n]) for n in g_outputs]
        for i, (n, a) in enumerate(zip(g_outputs, ref_np)):
            save_tensor(os.path.join(sd, f"output_{i}.pb"), a, n)
        entry["data_sets"].append({
            "dir": f"test_data_set_{k}", "what": desc, "reference": precision,
            "inputs": {n: list(feeds[n].shape) for n in g_inputs},
            "outputs": {n: list(a.shape) for n, a in zip(g_outputs, ref_np)}})
        ort_sets.append(({n: feeds[n].numpy() for n in g_inputs}, ref_np))

    entry["ops"] = op_types(m)
    entry["shape_operand_dependencies"] = shape_dependencies(m)
    entry["bytes"] = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    if check_ort:
        try:
            entry["ort_max_abs_err"] = run_ort(path, ort_sets)
        except Exception as e:  # noqa: BLE001 -- recorded: the export is kept for graphfuse
            entry["ort_error"] = f"{type(e).__name__}: {e}"[:2000]
    print(f"  {dirname}: opset {entry['opset']}, {entry['bytes'] / 1024:.0f} KiB, "
          f"{sum(entry['ops'].values())} nodes"
          + (f", ort max abs err {entry.get('ort_max_abs_err', entry.get('ort_error'))}" if check_ort else ""))
    return dirname, entry


def hash_name(s):
    """A stable small hash (Python's hash() is salted per process)."""
    h = 0
    for c in s.encode():
        h = (h * 131 + c) % 1000003
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "models", "hf"))
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), help="models to export")
    ap.add_argument("--exporters", nargs="+", choices=EXPORTERS, default=list(EXPORTERS))
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--attn", nargs="+", choices=ATTN, default=list(ATTN),
                    help="transformers' attn_implementation: sdpa (its default) and / or eager")
    ap.add_argument("--check-ort", action="store_true", help="run each export in onnxruntime")
    args = ap.parse_args()

    out_root = os.path.normpath(args.out)
    os.makedirs(out_root, exist_ok=True)
    manifest_path = os.path.join(out_root, "MANIFEST.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    explicit = any(a in sys.argv for a in ("--exporters", "--variants", "--attn"))
    for name in args.only or list(MODELS):
        combos = [(e, v, a) for e in args.exporters for v in args.variants for a in args.attn]
        if name in VARIANT_PLAN and not explicit:
            combos = VARIANT_PLAN[name]
        for exporter, variant, attn in combos:
            r = export_one(name, exporter, variant, attn, out_root, args.check_ort)
            if r is None:
                continue
            manifest[r[0]] = r[1]
            with open(manifest_path, "w") as f:
                json.dump(dict(sorted(manifest.items())), f, indent=1, sort_keys=False)
                f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
