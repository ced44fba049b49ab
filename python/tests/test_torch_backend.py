"""torch.compile(backend="graphfuse"): transformers' LLaMA, GPT-2 and BERT against eager and a
float64 reference at two shapes, fallback to PyTorch for ops graphfuse lacks, Dynamo's dynamic
shapes, grad, in-place parameter updates, options, and torch tensors read by sessions.

torch and transformers come from the project's Python venv (scripts/test_python.sh); with
GRAPHFUSE_REQUIRE_TORCH=1 (set there) a missing torch fails instead of skipping.
"""

import collections
import copy
import os
import warnings

import numpy as np
import pytest

if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") == "1":
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

import onnx
from onnx import TensorProto, helper

import graphfuse as gf
import graphfuse.torch_backend as gtb

VOCAB = 96


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    gtb.clear_reports()
    yield
    torch._dynamo.reset()


def _llama():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        )
    )


def _gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                bos_token_id=0, eos_token_id=0)
    )


def _bert():
    return transformers.BertModel(
        transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=160, max_position_embeddings=128),
        add_pooling_layer=False,
    )


FAMILIES = {"llama": _llama, "gpt2": _gpt2, "bert": _bert}

# Further architectures, each tiny (hidden 64, 2 layers, random weights, transformers' default
# attention), for the padded-batch test below.
_T = transformers
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=128)
PADDED_FAMILIES = dict(FAMILIES, **{
    "qwen2": lambda: _T.Qwen2ForCausalLM(_T.Qwen2Config(num_key_value_heads=2, **_COMMON)),
    "mistral": lambda: _T.MistralForCausalLM(_T.MistralConfig(num_key_value_heads=2, **_COMMON)),
    "qwen3": lambda: _T.Qwen3ForCausalLM(_T.Qwen3Config(num_key_value_heads=2, head_dim=16, **_COMMON)),
    "phi": lambda: _T.PhiForCausalLM(_T.PhiConfig(**_COMMON)),
    "falcon": lambda: _T.FalconForCausalLM(_T.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                          num_attention_heads=4)),
    "gptj": lambda: _T.GPTJForCausalLM(_T.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                                    rotary_dim=8, bos_token_id=0, eos_token_id=0)),
    "gemma2": lambda: _T.Gemma2ForCausalLM(_T.Gemma2Config(num_key_value_heads=2, head_dim=16, **_COMMON)),
    "bloom": lambda: _T.BloomForCausalLM(_T.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)),
    "distilbert": lambda: _T.DistilBertModel(_T.DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                                                                 hidden_dim=128)),
    "debertav2": lambda: _T.DebertaV2Model(_T.DebertaV2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                              num_attention_heads=4, intermediate_size=128)),
    "t5enc": lambda: _T.T5EncoderModel(_T.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                  num_heads=4)),
})


def _first_output(out):
    if hasattr(out, "logits"):
        return out.logits
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


_ENCODERS = {"bert", "distilbert", "debertav2", "t5enc"}


def _call(model, family, ids, mask):
    kwargs = {} if family in _ENCODERS else {"use_cache": False}
    return _first_output(model(input_ids=ids, attention_mask=mask, **kwargs))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_match_eager_and_float64_at_two_shapes(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    model64 = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="graphfuse")
    unfused = torch.compile(copy.deepcopy(model), backend="graphfuse", options={"fusion": False})
    shapes = [(2, 9), (1, 23)]
    with torch.no_grad():
        for shape in shapes:
            ids = torch.randint(0, VOCAB, shape)
            mask = torch.ones(shape, dtype=torch.long)
            eager = _call(model, family, ids, mask)
            ref = _call(model64, family, ids, mask)
            got = _call(compiled, family, ids, mask)
            base = _call(unfused, family, ids, mask)
            assert got.shape == eager.shape and got.dtype == eager.dtype
            eager_err = (eager.double() - ref).abs().max().item()
            err = (got.double() - ref).abs().max().item()
            assert err <= 10 * eager_err + 1e-5, f"{family} {shape}: {err} vs eager's {eager_err}"
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got, base, rtol=1e-4, atol=1e-5)
            assert not torch.isnan(got).any()
    reports = [r for r in gtb.reports() if r["partitions"]]
    fused = [r for r in reports if r["partitions"][0]["kernels_after"] < r["partitions"][0]["kernels_before"]]
    # Each shape compiled once for each of the two models, every one fused by graphfuse.
    assert len(reports) == 2 * len(shapes), reports
    assert len(fused) == len(shapes), fused
    for r in fused:
        assert r["compile_ms"] > 0
        # The transformer layers run in graphfuse: nearly every ATen op is in a partition.
        in_graphfuse = sum(p["ops"] for p in r["partitions"])
        assert in_graphfuse >= 0.9 * r["aten_ops"], r


@pytest.mark.parametrize("family", sorted(PADDED_FAMILIES))
def test_padded_batches_match_eager(family):
    """A batch of two whose first row is padded on the left (as generate() pads decoders), on
    the right, or not at all. Left padding under a causal mask leaves the padded query
    positions no key: their softmax is over -inf alone, which PyTorch's SDPA returns as 0. Were
    it NaN, it would reach every later position of the row through the keys and values."""
    torch.manual_seed(10)
    model = PADDED_FAMILIES[family]().eval()
    compiled = torch.compile(model, backend="graphfuse")
    ids = torch.randint(1, VOCAB, (2, 11))
    with torch.no_grad():
        for pad in ("left", "right", "none"):
            mask = torch.ones(2, 11, dtype=torch.long)
            if pad == "left":
                mask[0, :3] = 0
            elif pad == "right":
                mask[0, -3:] = 0
            got = _call(compiled, family, ids, mask)
            eager = _call(model, family, ids, mask)
            assert not torch.isnan(got).any(), f"{family}, {pad} padding: NaN in rows {torch.isnan(got).flatten(1).any(1)}"
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5, msg=lambda m: f"{family}, {pad} padding: {m}")
    assert all(r["partitions"] for r in gtb.reports()), gtb.reports()


@pytest.mark.parametrize("family", sorted(PADDED_FAMILIES))
def test_dynamic_shapes_of_every_family(family):
    """dynamic=True on each architecture, two batch and sequence sizes with a left-padded row:
    eager's outputs, every Dynamo graph compiled once (symbolically) and run whole in one
    graphfuse partition, the masks computed from the symbolic sizes included."""
    torch.manual_seed(17)
    model = PADDED_FAMILIES[family]().eval()
    compiled = torch.compile(model, backend="graphfuse", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for shape in [(2, 7), (3, 12)]:
            ids = torch.randint(1, VOCAB, shape)
            mask = torch.ones(shape, dtype=torch.long)
            mask[0, :2] = 0
            torch.testing.assert_close(_call(compiled, family, ids, mask), _call(model, family, ids, mask),
                                       rtol=1e-4, atol=1e-5, msg=lambda m: f"{family} {shape}: {m}")
    stats = gtb.session_stats()
    assert all(s["symbolic"] and s["compiles"] == 1 for s in stats.values()), stats
    for r in gtb.reports():
        assert not r["fallback"] and len(r["partitions"]) == 1, (family, r["fallback"])


def test_generate_left_padded_batch_matches_eager():
    """generate() on two prompts of different lengths, left-padded as transformers asks of
    decoders: the same tokens as eager for both rows."""
    torch.manual_seed(11)
    model = _llama().eval()
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :4] = 0  # the first prompt is 5 tokens, the second 9
    ids[0, :4] = 0
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        model.forward = torch.compile(model.forward, backend="graphfuse")
        got = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert got.tolist() == expected.tolist()


def test_generate_with_static_cache_matches_eager():
    """transformers' static KV cache (its advice for torch.compile): fixed shapes, rows written
    in place with index_copy_ and a length counter advanced in place. The same tokens as eager,
    one graphfuse compilation for prefill and one for decode, and the layers' compute in
    graphfuse partitions with only the in-place cache writes left to PyTorch."""
    torch.manual_seed(12)
    model = _llama().eval()
    ids = torch.randint(1, VOCAB, (1, 7))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
        model.forward = torch.compile(model.forward, backend="graphfuse")
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to PyTorch whole
            first = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
            again = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert first.tolist() == expected.tolist()
    assert again.tolist() == expected.tolist()
    reports = gtb.reports()
    per_graph = collections.Counter(r["graph"] for r in reports)
    assert sorted(per_graph.values()) == [1, 1], reports  # prefill and decode, once each
    for r in reports:
        assert r["partitions"], r
        in_graphfuse = sum(p["ops"] for p in r["partitions"])
        left = {k: v["count"] for k, v in r["fallback"].items()}
        assert set(left) <= {"aten.index_copy.default", "aten.copy_.default"}, left
        assert in_graphfuse >= 0.9 * r["aten_ops"], r


def test_check_option_names_the_partition_that_differs(monkeypatch):
    """options={"check": True}: on a signature's first call every partition is compared with
    its ATen ops run in PyTorch. A correct plan passes; a session that returns wrong numbers is
    named in a warning and in the report."""
    torch.manual_seed(13)
    model = _llama().eval()
    ids = torch.randint(1, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        compiled = torch.compile(model, backend="graphfuse", options={"check": True})
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            _call(compiled, "llama", ids, mask)
        [report] = gtb.reports()
        assert report["partitions"]
        for p in report["partitions"]:
            assert p["check"]["checked"] and p["check"]["ok"], p
            assert p["check"]["max_abs_err"] < 1e-4

        torch._dynamo.reset()
        gtb.clear_reports()
        real_session = gtb.InferenceSession

        class OffByOne:  # a session whose first output is 1 too large everywhere
            def __init__(self, inner):
                self.inner = inner

            def run(self, arrays):
                outs = self.inner.run(arrays)
                return [outs[0] + 1] + list(outs[1:])

            def __getattr__(self, name):
                return getattr(self.inner, name)

        def wrong_session(*args, **kwargs):
            session = real_session(*args, **kwargs)
            session._session = OffByOne(session._session)
            return session

        monkeypatch.setattr(gtb, "InferenceSession", wrong_session)
        monkeypatch.setenv("GRAPHFUSE_CHECK", "1")
        compiled = torch.compile(model, backend="graphfuse")
        with pytest.warns(RuntimeWarning, match=r"graphfuse check: graph \d+ partition \w+ differs from eager at output 0"):
            _call(compiled, "llama", ids, mask)
    [report] = gtb.reports()
    assert not report["partitions"][0]["check"]["ok"], report["partitions"][0]


def test_op_graphfuse_lacks_falls_back_to_pytorch():
    class SortsInTheMiddle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 48)
            self.b = torch.nn.Linear(48, 16)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.a(x) * 0.5 + 1.0)
            h = torch.sort(h, dim=-1).values  # no graphfuse kernel
            return torch.tanh(self.b(h) - 0.25)

    torch.manual_seed(1)
    model = SortsInTheMiddle().eval()
    x = torch.randn(4, 32)
    compiled = torch.compile(model, backend="graphfuse")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    [report] = gtb.reports()
    assert "aten.sort.default" in report["fallback"], report["fallback"]
    assert "no translation" in report["fallback"]["aten.sort.default"]["reason"]
    assert len(report["partitions"]) == 2  # before and after the sort


def test_dynamo_dynamic_shapes_compile_once():
    """dynamic=True: Dynamo hands over one graph of symbolic batch and sequence, which graphfuse
    compiles once, for every shape (a session per partition, planned per shape), and matches
    eager and a float64 reference at each, a padded row included. With options["symbolic"] off
    the same graph compiles per shape, and the report says why."""
    torch.manual_seed(2)
    model = _gpt2().eval()
    model64 = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="graphfuse", dynamic=True)
    per_shape = torch.compile(copy.deepcopy(model), backend="graphfuse", dynamic=True, options={"symbolic": False})
    shapes = [(2, 5), (3, 11), (2, 17)]  # batch 1 would be a graph of its own (Dynamo specializes 0 and 1)
    with torch.no_grad():
        for shape in shapes:
            ids = torch.randint(0, VOCAB, shape)
            mask = torch.ones(shape, dtype=torch.long)
            mask[0, :2] = 0
            got, eager, ref = (_call(m, "gpt2", ids, mask) for m in (compiled, model, model64))
            eager_err = (eager.double() - ref).abs().max().item()
            err = (got.double() - ref).abs().max().item()
            assert err <= 10 * eager_err + 1e-5, f"{shape}: {err} vs eager's {eager_err}"
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(_call(per_shape, "gpt2", ids, mask), eager, rtol=1e-4, atol=1e-5)
    stats = gtb.session_stats()
    symbolic = {g: s for g, s in stats.items() if s["symbolic"]}
    [(graph, s)] = symbolic.items()
    assert s["compiles"] == 1 and s["sessions"] == 1 and s["plans_made"] == len(shapes), s
    [report] = [r for r in gtb.reports() if r["graph"] == graph]
    assert report["symbolic"] and len(report["dims"]) >= 2, report  # batch and sequence
    # The whole model, the mask computed from attention_mask included, runs in one partition.
    assert not report["fallback"] and len(report["partitions"]) == 1, report["fallback"]
    [(other, o)] = [(g, s) for g, s in stats.items() if not s["symbolic"]]
    assert o["compiles"] == len(shapes) and o["symbolic_refused"] == 'options["symbolic"] is False', o
    assert all(r["symbolic_refused"] == o["symbolic_refused"] for r in gtb.reports() if r["graph"] == other)


def test_size_passed_as_int_becomes_a_size_input():
    """dynamic=True with an int argument: Dynamo passes it as a size (SymInt) that no input
    tensor carries. The partition reads it from a size input (an empty [0, n] tensor), for
    arange and full of that length; one compilation serves every n."""

    class Ramp(torch.nn.Module):
        def forward(self, x, n: int):
            return torch.arange(n, dtype=torch.float32) * x.sum() + torch.full((n,), 0.5) - n

    model = Ramp()
    compiled = torch.compile(model, backend="graphfuse", dynamic=True)
    x = torch.randn(4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for n in (5, 7, 9):
            torch.testing.assert_close(compiled(x, n), model(x, n), rtol=1e-5, atol=1e-5)
    [report] = gtb.reports()
    assert report["symbolic"] and len(report["size_inputs"]) == 1, report
    assert not report["fallback"] and len(report["partitions"]) == 1, report
    [s] = gtb.session_stats().values()
    assert s["compiles"] == 1 and s["sessions"] == 1 and s["plans_made"] == 3, s


def test_symbolic_tracing_refused_compiles_per_shape(monkeypatch):
    """A graph that cannot be traced symbolically is compiled per signature, as before, and its
    reports say why."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()

    def refuse(gm):
        raise RuntimeError("no symbolic trace here")

    monkeypatch.setattr(gtb, "_trace_symbolic", refuse)
    compiled = torch.compile(model, backend="graphfuse", dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 7):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    [(graph, s)] = gtb.session_stats().items()
    assert not s["symbolic"] and s["compiles"] == 3, s
    assert s["symbolic_refused"] == "RuntimeError: no symbolic trace here", s
    assert [r["symbolic_refused"] for r in gtb.reports()] == [s["symbolic_refused"]] * 3
    assert all(r["partitions"] for r in gtb.reports())


def test_signature_cache_and_parameter_update():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8)).eval()
    compiled = torch.compile(model, backend="graphfuse")
    x = torch.randn(5, 16)
    with torch.no_grad():
        first = compiled(x)
        compiled(x)
        assert len(gtb.reports()) == 1  # the same signature compiles once
        model[0].weight.mul_(2.0)  # parameters are constants: an in-place update compiles again
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(compiled(x), first)
    assert len(gtb.reports()) == 2


def test_grad_enabled_runs_in_pytorch():
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = torch.compile(model, backend="graphfuse")
    x = torch.randn(3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
    assert any("inference" in str(w.message) for w in caught)
    out.sum().backward()  # training stays correct
    assert model[0].weight.grad is not None
    torch.testing.assert_close(out, model(x))


def test_bf16_model():
    """The elementwise chain between the GEMMs runs in graphfuse in bf16; the GEMMs stay in
    PyTorch (graphfuse's CPU GEMM is f32), named as such in the report."""

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 64)
            self.b = torch.nn.Linear(64, 32)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x) * 0.5 + 0.25) - 0.125)

    torch.manual_seed(5)
    model = Mlp().eval().to(torch.bfloat16)
    x = torch.randn(6, 32, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="graphfuse")
    with torch.no_grad():
        got = compiled(x)
        eager = model(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)
    [report] = gtb.reports()
    assert "f32" in report["fallback"]["aten.addmm.default"]["reason"]
    assert [p["ops"] for p in report["partitions"]] == [4]  # mul, add, gelu, sub


def test_unknown_option_is_an_error():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(model, backend="graphfuse", options={"fusoin": False})(torch.randn(2, 4))


def test_backend_registered():
    assert "graphfuse" in torch._dynamo.list_backends()
    from importlib.metadata import entry_points

    names = [e.name for e in entry_points(group="torch_dynamo_backends")]
    assert "graphfuse" in names, "the entry point is missing: was graphfuse installed with pip?"


def _add_model(dtype: int) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"])], "add",
        [helper.make_tensor_value_info("a", dtype, ["n", 8]), helper.make_tensor_value_info("b", dtype, ["n", 8])],
        [helper.make_tensor_value_info("d", dtype, ["n", 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_session_reads_torch_tensors(dtype):
    onnx_type = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
                 torch.bfloat16: TensorProto.BFLOAT16}[dtype]
    session = gf.InferenceSession(_add_model(onnx_type))
    a = torch.randn(5, 8).to(dtype)
    b = torch.randn(8, 5).to(dtype).t()  # not contiguous
    a.requires_grad_(dtype == torch.float32)
    [d] = session.run(None, {"a": a, "b": b})
    expected = ((a.detach().float() + b.float()).to(dtype).float() * a.detach().float()).to(dtype).float()
    np.testing.assert_allclose(d.astype(np.float32), expected.numpy(), rtol=1e-2 if dtype != torch.float32 else 1e-6)


def test_session_refuses_device_tensors():
    class FakeDevice:
        def __dlpack__(self, stream=None):
            raise AssertionError("not read")

        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

    session = gf.InferenceSession(_add_model(TensorProto.FLOAT))
    with pytest.raises(gf.InvalidArgument, match="device memory"):
        session.run(None, {"a": FakeDevice(), "b": np.zeros((1, 8), np.float32)})


def test_what_graphfuse_cannot_compile_or_run_falls_back(monkeypatch):
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)

    def no_trace(*args, **kwargs):
        raise RuntimeError("tracing refused")

    with monkeypatch.context() as m:
        m.setattr(gtb, "_trace", no_trace)
        compiled = torch.compile(model, backend="graphfuse")
        with pytest.warns(RuntimeWarning, match="runs in PyTorch: RuntimeError: tracing refused"), torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    assert gtb.reports()[-1]["fallback"]["*"]["reason"] == "RuntimeError: tracing refused"

    torch._dynamo.reset()

    def failing_run(self, *tensors):
        raise gf.Internal("plan failed")

    with monkeypatch.context() as m:
        m.setattr(gtb._Runner, "forward", failing_run)
        compiled = torch.compile(model, backend="graphfuse")
        with pytest.warns(RuntimeWarning, match="plan failed"), torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # the signature now runs in PyTorch, without a new warning
            torch.testing.assert_close(compiled(x), model(x))


def test_translations_match_eager():
    """Many ATen ops of the translation table in one graph, none left to PyTorch."""

    class Ops(torch.nn.Module):
        def forward(self, x, y, idx):
            a = torch.rsub(x * 2.0, y, alpha=3.0).exp() + torch.sub(x, y, alpha=0.5) * torch.add(x, 1.5, alpha=2)
            b = torch.where(x > y, torch.clamp(x, -0.5, 0.5), torch.sigmoid(y)) - torch.maximum(x, y) / (y.abs() + 1)
            c = torch.nn.functional.silu(a).pow(2) + torch.rsqrt(x * x + 1) + torch.erf(y) + torch.cos(x) * torch.sin(y)
            d = torch.softmax(c, dim=-1) + torch.log_softmax(b, dim=0) + c.mean(-1, keepdim=True) - b.amax(0)
            e = torch.cat([d[:, 3:], d[:, :3]], dim=1).transpose(0, 1)
            f = e.reshape(-1, 2).sum(-1) + torch.ones_like(e.reshape(-1, 2)[:, 0])
            g = torch.nn.functional.embedding(idx, x) * ((x[:2].unsqueeze(0) >= 0) & (y[:2].unsqueeze(0) < 1)).float()
            h = torch.nn.functional.layer_norm(x, (5,)) + torch.tanh(y).masked_fill(y < -1, 0.25)
            h = h + torch.remainder(x, 0.7) - torch.fmod(y, 0.6)
            return f, g.sum(0), h, (x.floor() + y.ceil()).to(torch.int64) % 3

    torch.manual_seed(7)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    idx = torch.tensor([[0, 3], [2, 1], [1, 1]])
    model = Ops()
    compiled = torch.compile(model, backend="graphfuse")
    with torch.no_grad():
        for got, want in zip(compiled(x, y, idx), model(x, y, idx)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    [report] = gtb.reports()
    left = {k: v for k, v in report["fallback"].items() if "partition too small" not in v["reason"]}
    assert not left, left
    assert sum(p["ops"] for p in report["partitions"]) >= 0.9 * report["aten_ops"], report


def test_generate_with_kv_cache_matches_eager():
    """transformers' generate() over a KV cache, the model's forward compiled: the same tokens
    as eager. Dynamo compiles the prefill and the first step for their shapes, then (automatic
    dynamic) one graph of symbolic cache length, which graphfuse compiles once for every
    later step."""
    torch.manual_seed(8)
    model = _llama().eval()
    ids = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
        model.forward = torch.compile(model.forward, backend="graphfuse")
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert got.tolist() == expected.tolist()
    reports = gtb.reports()
    assert len(reports) == 3 and all(r["partitions"] for r in reports), reports
    assert [r["symbolic"] for r in reports] == [False, False, True]
    assert "float32[1, 2, 6, 16]" in reports[1]["signature"]  # the first step, over 6 cached keys
    decode = gtb.session_stats()[reports[2]["graph"]]
    # steps 2 to 5: step 2 planned with steps 3 and 4 ahead of their calls, step 5 from the template
    assert decode["compiles"] == 1 and decode["plans_made"] == 2 and decode["hits"] == 2, decode


def _llama_generate_compiles(model, ids, mask, new_tokens):
    """generate() greedy under eager and with forward compiled by graphfuse: (eager's tokens,
    graphfuse's, session_stats())."""
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, pad_token_id=0)
        eager_forward = model.forward
        model.forward = torch.compile(model.forward, backend="graphfuse")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to PyTorch whole
                got = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        finally:
            model.forward = eager_forward
    return expected, got, gtb.session_stats()


def test_generate_64_tokens_compiles_at_most_3_times_per_graph():
    """Issue 38's criterion at a small size: generate() of 64 tokens with forward compiled
    gives eager's tokens, with at most 3 graphfuse compilations per Dynamo graph (here one:
    prefill, first step, then one symbolic graph for the other 62 steps), and the decode
    session plans its later lengths from a shape-class template."""
    torch.manual_seed(14)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=320, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    ).eval()
    ids = torch.randint(1, VOCAB, (1, 12))
    expected, got, stats = _llama_generate_compiles(model, ids, torch.ones_like(ids), 64)
    assert got.shape[1] == 12 + 64
    assert got.tolist() == expected.tolist()
    assert stats and all(s["compiles"] <= 3 for s in stats.values()), stats
    assert sum(s["compiles"] for s in stats.values()) <= 3, stats
    [decode] = [s for s in stats.values() if s["symbolic"]]
    # the first length is planned from the model with the next two (which fit and check the
    # template), found by their calls; the later ones come from the template
    assert decode["plans_made"] == 62 - 2 and decode["plans_from_template"] == 62 - 3, decode
    for r in gtb.reports():
        assert not r["fallback"] and len(r["partitions"]) == 1, r


def test_generate_dynamic_prompts_compile_once():
    """forward compiled with dynamic=True, generate() after prompts of three lengths: a symbolic
    prefill graph (its causal mask computed from the symbolic length, a constant that tracing
    lifted kept) and a symbolic decode graph, each compiled once; eager's tokens for each."""
    torch.manual_seed(16)
    model = _llama().eval()
    prompts = [torch.randint(1, VOCAB, (1, n)) for n in (7, 11, 15)]
    with torch.no_grad():
        expected = [model.generate(p, max_new_tokens=6, do_sample=False).tolist() for p in prompts]
        model.forward = torch.compile(model.forward, backend="graphfuse", dynamic=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            got = [model.generate(p, max_new_tokens=6, do_sample=False).tolist() for p in prompts]
    assert got == expected
    stats = gtb.session_stats()
    assert len(stats) == 2 and all(s["symbolic"] and s["compiles"] == 1 for s in stats.values()), stats
    prefill, decode = sorted(stats.values(), key=lambda s: s["plans_made"])
    assert prefill["plans_made"] == 3, stats  # one plan per prompt length, in one session
    assert decode["plans_made"] > 5, stats  # the cache lengths of all three generations, in one session
    for r in gtb.reports():
        assert not r["fallback"] and len(r["partitions"]) == 1, r


def test_generate_left_padded_batch_compiles_once_per_graph():
    """generate() of a left-padded batch: the graph takes attention_mask, whose padding mask
    (mask[batch_idx, kv_idx]) and causal mask are computed in the partition from symbolic
    sizes. Eager's tokens, one compilation per Dynamo graph, and the decode lengths after the
    first three planned from a shape-class template (no mask constant of the cache's length)."""
    torch.manual_seed(15)
    model = _llama().eval()
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :4] = 0
    ids[0, :4] = 0
    expected, got, stats = _llama_generate_compiles(model, ids, mask, 16)
    assert got.tolist() == expected.tolist()
    assert all(s["compiles"] == 1 for s in stats.values()), stats
    [decode] = [s for s in stats.values() if s["symbolic"]]
    assert decode["sessions"] == 1 and decode["plans_made"] == 14 - 2, decode  # 2 planned ahead
    assert decode["plans_from_template"] == 14 - 3, decode
    for r in gtb.reports():
        assert not r["fallback"] and len(r["partitions"]) == 1, r
