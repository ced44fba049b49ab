#!/usr/bin/env python3
"""Writes ONNX's backend node tests (models and data sets) from the onnx package installed here,
for tests/onnx/node_tests.cc (GF_ONNX_NODE_DIR). Debian's libonnx-testdata is ONNX 1.12's and
stops at opset 17; the project's venv pins a current onnx, whose cases reach today's opsets.

    ~/.cache/graphfuse/venv/bin/python tools/onnx_node_data.py OUT_DIR [--ops Attention,Cast,...]

Each case becomes OUT_DIR/test_<name>/model.onnx with test_data_set_<i>/input_<j>.pb and
output_<j>.pb, the layout of onnx/backend/test/data/node. Cases with sequence, map or optional
inputs or outputs are left out (graphfuse takes tensors only)."""

import argparse
import os
import shutil
import sys
import warnings

from onnx import TensorProto, numpy_helper
from onnx.backend.test.case import node


def tensor_only(case) -> bool:
    values = list(case.model.graph.input) + list(case.model.graph.output)
    return all(v.type.HasField("tensor_type") for v in values)


def write_value(path: str, value, name: str) -> None:
    proto = value if isinstance(value, TensorProto) else numpy_helper.from_array(value, name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--ops", default="", help="comma-separated op types (default: every case)")
    args = p.parse_args()
    ops = [o for o in args.ops.split(",") if o] or [None]
    written = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for op in ops for c in node.collect_testcases(op)]
    for case in cases:
        if not case.model or not case.data_sets or not tensor_only(case):
            continue
        out = os.path.join(args.out, case.name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        with open(os.path.join(out, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            d = os.path.join(out, f"test_data_set_{i}")
            os.makedirs(d)
            for j, v in enumerate(inputs):
                write_value(os.path.join(d, f"input_{j}.pb"), v, case.model.graph.input[j].name)
            for j, v in enumerate(outputs):
                write_value(os.path.join(d, f"output_{j}.pb"), v, case.model.graph.output[j].name)
        written += 1
    print(f"{written} node tests written to {args.out}", file=sys.stderr)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
