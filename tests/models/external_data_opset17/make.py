"""Writes the command-line test's external-data models (run with the project's venv python):

  model.onnx + model.onnx.data   y = x @ W + b, W [3, 4] and b [4] kept in model.onnx.data (as the
                                 dynamo exporter keeps every weight), the good reference, with
                                 test_data_set_0 (random x, y from float64) for the models test
  outside/model.onnx             the same graph whose W points at "../model.onnx.data": a location
                                 that leaves the model's folder, refused with exit 2
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.dirname(os.path.abspath(__file__))
w = (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4)
b = np.arange(4, dtype=np.float32) * 0.5 + 0.125


def model(location_w: str, location_b: str) -> onnx.ModelProto:
    inits = []
    offset = 0
    for name, value, location in (("W", w, location_w), ("b", b, location_b)):
        t = numpy_helper.from_array(value, name)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, val in (("location", location), ("offset", str(offset)), ("length", str(value.nbytes))):
            t.external_data.add(key=key, value=val)
        offset += 64  # each tensor at a 64-byte boundary
        inits.append(t)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"), helper.make_node("Add", ["xw", "b"], ["y"], name="add")],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


data = bytearray(128)
data[0:48] = w.tobytes()
data[64:80] = b.tobytes()
with open(os.path.join(here, "model.onnx.data"), "wb") as f:
    f.write(bytes(data))
onnx.save(model("model.onnx.data", "model.onnx.data"), os.path.join(here, "model.onnx"))
os.makedirs(os.path.join(here, "outside"), exist_ok=True)
onnx.save(model("../model.onnx.data", "../model.onnx.data"), os.path.join(here, "outside", "model.onnx"))

rng = np.random.default_rng(17)
x = rng.standard_normal((2, 3)).astype(np.float32)
y = (x.astype(np.float64) @ w.astype(np.float64) + b).astype(np.float32)
os.makedirs(os.path.join(here, "test_data_set_0"), exist_ok=True)
for name, value in (("input_0.pb", numpy_helper.from_array(x, "x")), ("output_0.pb", numpy_helper.from_array(y, "y"))):
    with open(os.path.join(here, "test_data_set_0", name), "wb") as f:
        f.write(value.SerializeToString())
