#!/usr/bin/env python3
"""Writes small ONNX models that the command-line test (tests/cli_test.sh) runs, into DIR:

  fusion_cycle.onnx  the 15-node graph, cut down from an exported model, on which elementwise
                     fusion once made a cycle (two groups each reachable from the other only
                     through a third)
  norm_gemm.onnx     an RMSNorm read by two projections with a SwiGLU product (1024 -> 256,
                     16 rows, weights ~N(0, 0.1^2)): the fused plan folds the norm's scale into
                     the weights and accumulates in another order, so it differs from the
                     unfused plan by more than 1e-5 relative + 1e-6 absolute (the bound `bench`
                     once hard-coded) yet well within `run`'s defaults

  dynamic_mlp.onnx   x[batch, seq, 8] and mask[batch, seq] -> Reshape(relu(x @ W + B) * mask, [batch, -1]),
                     the reshape's shape computed from Shape(x) as exporters write it; with a
                     test_data_set_0 (batch 2, seq 3) whose reference numpy computed in float64
  value_reshape.onnx Relu(Reshape(x[6, 4], s)) with s an input: its values become the shape

Needs the onnx and numpy Python packages (Debian's python3-onnx, installed by
scripts/setup.sh). Usage: make_cli_models.py DIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def fusion_cycle():
    shape = [2, 16, 64]

    def inp(name, dims):
        return h.make_tensor_value_info(name, T.FLOAT, dims)

    nodes = [
        h.make_node("Add", ["a", "b"], ["d"]),
        h.make_node("Div", ["c", "w"], ["u"]),
        h.make_node("Add", ["u", "k1"], ["u1"]),
        h.make_node("Add", ["s", "k2"], ["s1"]),
        h.make_node("Pow", ["u1", "k3"], ["p1"]),
        h.make_node("Pow", ["t", "k4"], ["p2"]),
        h.make_node("Add", ["p1", "p2"], ["pw"]),
        h.make_node("Max", ["d", "l"], ["mx"]),
        h.make_node("Min", ["pw", "s1"], ["mn"]),
        h.make_node("Greater", ["y", "k5"], ["cond"]),
        h.make_node("Where", ["cond", "mx", "mn"], ["sel"]),
        h.make_node("Cast", ["cond"], ["m"], to=T.FLOAT),
        h.make_node("Mul", ["m", "u"], ["mu"]),
        h.make_node("Add", ["sel", "mu"], ["z"]),
        h.make_node("ReduceMean", ["z"], ["mean"], axes=[-1], keepdims=1),
    ]
    inputs = [inp(n, shape) for n in ["a", "b", "c", "s", "t", "l", "y"]] + [inp("w", [64])]
    inputs += [inp(n, []) for n in ["k1", "k2", "k3", "k4", "k5"]]
    g = h.make_graph(nodes, "repro", inputs, [h.make_tensor_value_info("mean", T.FLOAT, [2, 16, 1])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def norm_gemm(d=1024, n=256, rows=16, scale=0.1):
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array(rng.standard_normal(d).astype(np.float32), "gamma"),
        nh.from_array((rng.standard_normal((d, n)) * scale).astype(np.float32), "w_gate"),
        nh.from_array((rng.standard_normal((d, n)) * scale).astype(np.float32), "w_up"),
        nh.from_array(np.array([2.0], np.float32), "two"),
        nh.from_array(np.array([1e-6], np.float32), "eps"),
    ]
    nodes = [
        h.make_node("Pow", ["x", "two"], ["sq"]),
        h.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        h.make_node("Add", ["ms", "eps"], ["mse"]),
        h.make_node("Sqrt", ["mse"], ["rms"]),
        h.make_node("Div", ["x", "rms"], ["xn"]),
        h.make_node("Mul", ["xn", "gamma"], ["xs"]),
        h.make_node("MatMul", ["xs", "w_gate"], ["gate"]),
        h.make_node("MatMul", ["xs", "w_up"], ["up"]),
        h.make_node("Sigmoid", ["gate"], ["sg"]),
        h.make_node("Mul", ["gate", "sg"], ["act"]),
        h.make_node("Mul", ["act", "up"], ["y"]),
    ]
    g = h.make_graph(nodes, "norm_gemm", [h.make_tensor_value_info("x", T.FLOAT, [rows, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, [rows, n])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def dynamic_mlp(out):
    rng = np.random.RandomState(3)
    w = rng.uniform(-1, 1, (8, 8)).astype(np.float32)
    b = rng.uniform(-1, 1, 8).astype(np.float32)
    inits = [nh.from_array(w, "W"), nh.from_array(b, "B"), nh.from_array(np.array([0], np.int64), "zero"),
             nh.from_array(np.array([-1], np.int64), "minus_one")]
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["mm"]),
        h.make_node("Add", ["mm", "B"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]),
        h.make_node("Unsqueeze", ["mask", "minus_one"], ["mask3"]),
        h.make_node("Mul", ["r", "mask3"], ["rm"]),
        h.make_node("Shape", ["x"], ["sx"]),
        h.make_node("Gather", ["sx", "zero"], ["batch"]),
        h.make_node("Concat", ["batch", "minus_one"], ["shape"], axis=0),
        h.make_node("Reshape", ["rm", "shape"], ["y"]),
    ]
    g = h.make_graph(nodes, "dynamic_mlp",
                     [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 8]),
                      h.make_tensor_value_info("mask", T.FLOAT, ["batch", "seq"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", None])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = rng.uniform(-1, 1, (2, 3, 8)).astype(np.float32)
    mask = (rng.uniform(0, 1, (2, 3)) > 0.3).astype(np.float32)
    y = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + b, 0) * mask[..., None]
    data = os.path.join(out, "dynamic_mlp_data")
    os.makedirs(data, exist_ok=True)
    for i, (name, t) in enumerate([("x", x), ("mask", mask)]):
        with open(os.path.join(data, "input_%d.pb" % i), "wb") as f:
            f.write(nh.from_array(t, name).SerializeToString())
    with open(os.path.join(data, "output_0.pb"), "wb") as f:
        f.write(nh.from_array(y.reshape(2, -1).astype(np.float32), "y").SerializeToString())
    return model


def value_reshape():
    nodes = [h.make_node("Reshape", ["x", "s"], ["y"]), h.make_node("Relu", ["y"], ["z"])]
    g = h.make_graph(nodes, "value_reshape",
                     [h.make_tensor_value_info("x", T.FLOAT, [6, 4]), h.make_tensor_value_info("s", T.INT64, [2])],
                     [h.make_tensor_value_info("z", T.FLOAT, [None, None])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_cli_models.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, model in [("fusion_cycle", fusion_cycle()), ("norm_gemm", norm_gemm()), ("dynamic_mlp", dynamic_mlp(out)),
                        ("value_reshape", value_reshape())]:
        onnx.checker.check_model(model)
        onnx.save(model, os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
