"""Shared helpers: the repository's ONNX models and their stored test data sets."""

import glob
import os

import numpy as np
import onnx
from onnx import numpy_helper

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models")

# The stored references are float64 (tests/models/hf) or the exporting framework's float32.
RTOL, ATOL = 1e-3, 1e-4


def model_path(name: str) -> str:
    return os.path.join(MODELS, name, "model.onnx")


def data_sets(name: str) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """(inputs, expected outputs) per test_data_set_* of a model, in the model's order."""
    sets = []
    for ds in sorted(glob.glob(os.path.join(MODELS, name, "test_data_set_*"))):
        load = lambda kind: [
            numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(ds, f"{kind}_*.pb")))
        ]
        sets.append((load("input"), load("output")))
    assert sets, f"{name}: no test data set"
    return sets


def feeds(session, inputs: list[np.ndarray]) -> dict:
    return {arg.name: value for arg, value in zip(session.get_inputs(), inputs)}


def assert_outputs_match(name: str, got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected), name
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"{name} output {k}: shape {g.shape}, expected {e.shape}"
        np.testing.assert_allclose(g, e.astype(g.dtype), rtol=RTOL, atol=ATOL, err_msg=f"{name} output {k}")
