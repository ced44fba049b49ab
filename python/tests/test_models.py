"""Sessions on tests/models match the stored references; declared inputs and outputs read as
onnxruntime gives them."""

import os

import numpy as np
import onnx
import pytest

import graphfuse as gf
from conftest import MODELS, assert_outputs_match, data_sets, feeds, model_path

BLOCKS = sorted(d for d in os.listdir(MODELS) if os.path.isfile(model_path(d)))
HF = ["hf/gpt2_ts_dynamic", "hf/gpt2_ts_kv", "hf/llama_dynamo_dynamic", "hf/bert_ts_dynamic", "hf/qwen2_dynamo_kv"]

ORT_TYPE = {
    onnx.TensorProto.FLOAT: "tensor(float)",
    onnx.TensorProto.FLOAT16: "tensor(float16)",
    onnx.TensorProto.BFLOAT16: "tensor(bfloat16)",
    onnx.TensorProto.INT32: "tensor(int32)",
    onnx.TensorProto.INT64: "tensor(int64)",
    onnx.TensorProto.BOOL: "tensor(bool)",
}


def test_corpus_found():
    assert len(BLOCKS) >= 16


@pytest.mark.parametrize("name", BLOCKS + HF)
def test_matches_reference(name):
    session = gf.InferenceSession(model_path(name))
    for inputs, expected in data_sets(name):
        assert_outputs_match(name, session.run(None, feeds(session, inputs)), expected)


@pytest.mark.parametrize("name", BLOCKS + HF)
def test_inputs_outputs_as_declared(name):
    graph = onnx.load(model_path(name)).graph
    initializers = {t.name for t in graph.initializer}
    declared_inputs = [v for v in graph.input if v.name not in initializers]
    session = gf.InferenceSession(model_path(name))
    for args, declared in ((session.get_inputs(), declared_inputs), (session.get_outputs(), graph.output)):
        assert [a.name for a in args] == [v.name for v in declared]
        for arg, value in zip(args, declared):
            tensor = value.type.tensor_type
            assert arg.type == ORT_TYPE[tensor.elem_type], arg
            dims = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
                for d in tensor.shape.dim
            ]
            assert arg.shape == dims, arg


def test_symbolic_dims_by_name():
    session = gf.InferenceSession(model_path("hf/gpt2_ts_kv"))
    shapes = {a.name: a.shape for a in session.get_inputs()}
    assert shapes["input_ids"] == ["batch", "seq"]
    assert any("past_seq" in [d for d in s if isinstance(d, str)] for s in shapes.values()), shapes
    assert session.get_outputs()[0].shape[:2] == ["batch", "seq"]
    assert session.get_inputs()[0].type == "tensor(int64)"


def test_static_shapes_are_ints():
    session = gf.InferenceSession(model_path("mlp_gelu_opset17"))
    for arg in session.get_inputs() + session.get_outputs():
        assert all(isinstance(d, int) for d in arg.shape), arg
        assert arg.type == "tensor(float)"


def test_from_bytes_and_pathlike():
    import pathlib

    name = "hf/bert_ts_dynamic"
    with open(model_path(name), "rb") as f:
        data = f.read()
    by_bytes = gf.InferenceSession(data)
    by_path = gf.InferenceSession(pathlib.Path(model_path(name)))
    inputs, expected = data_sets(name)[1]
    assert_outputs_match(name, by_bytes.run(None, feeds(by_bytes, inputs)), expected)
    for a, b in zip(by_bytes.run(None, feeds(by_bytes, inputs)), by_path.run(None, feeds(by_path, inputs))):
        np.testing.assert_array_equal(a, b)


def test_output_names_select_and_order():
    name = "hf/bert_ts_dynamic"
    session = gf.InferenceSession(model_path(name))
    names = [o.name for o in session.get_outputs()]
    assert len(names) == 2
    inputs, expected = data_sets(name)[2]
    got = session.run(list(reversed(names)), feeds(session, inputs))
    assert_outputs_match(name, got, list(reversed(expected)))
    assert_outputs_match(name, session.run(names[1:], feeds(session, inputs)), expected[1:])


@pytest.mark.parametrize("name", ["gpt2_block_opset17", "llama_block_opset17", "hf/llama_dynamo_dynamic"])
def test_fused_matches_unfused_on_random_inputs(name):
    fused = gf.InferenceSession(model_path(name))
    unfused = gf.InferenceSession(model_path(name), fusion=False)
    rng = np.random.default_rng(7)
    inputs, _ = data_sets(name)[-1]
    # Same shapes as the stored data, new values: floats random, integer inputs (token ids,
    # masks, positions) as stored.
    inputs = [rng.standard_normal(x.shape).astype(x.dtype) if x.dtype.kind == "f" else x for x in inputs]
    for a, b in zip(fused.run(None, feeds(fused, inputs)), unfused.run(None, feeds(unfused, inputs))):
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert fused.explain()["kernels_after"] < unfused.explain()["kernels_after"]
