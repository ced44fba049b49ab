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


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_cli_models.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, model in [("fusion_cycle", fusion_cycle()), ("norm_gemm", norm_gemm())]:
        onnx.checker.check_model(model)
        onnx.save(model, os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
