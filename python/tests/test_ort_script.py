"""A typical onnxruntime script (ort_script.py) runs with only its import changed to graphfuse,
and writes what onnxruntime's run of it writes: the same outputs (every way of running), the same
model metadata, and a profile that opens as Chrome-trace JSON and holds every kernel of the plan."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import graphfuse as gf
from conftest import ATOL, RTOL, model_path

if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") != "1":
    pytest.importorskip("onnxruntime")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_script.py")
ORT_IMPORT = "import onnxruntime as ort\n"


def _model_with_metadata(folder) -> str:
    m = onnx.load(model_path("hf/gpt2_ts_dynamic"))
    m.doc_string = "GPT-2, two layers, exported for the script test"
    m.model_version = 3
    m.domain = "test.graphfuse"
    entry = m.metadata_props.add()
    entry.key, entry.value = "purpose", "ort-script-test"
    path = os.path.join(folder, "model.onnx")
    onnx.save(m, path)
    return path


def _run(script: str, folder, tag: str, model: str) -> tuple[str, dict]:
    out = os.path.join(folder, f"{tag}.npz")
    done = subprocess.run([sys.executable, script, model, out, os.path.join(folder, f"{tag}_profile")],
                          capture_output=True, text=True, timeout=600, cwd=folder)
    assert done.returncode == 0, f"{tag}:\n{done.stdout}\n{done.stderr}"
    with np.load(out) as z:
        return done.stdout, {k: z[k] for k in z.files}


def test_onnxruntime_script_with_only_the_import_changed(tmp_path):
    model = _model_with_metadata(str(tmp_path))
    with open(SCRIPT) as f:
        original = f.read()
    assert original.count(ORT_IMPORT) == 1
    changed = original.replace(ORT_IMPORT, "import graphfuse as ort\n")
    script = tmp_path / "gf_script.py"
    script.write_text(changed)
    diff = [(a, b) for a, b in zip(original.splitlines(), changed.splitlines()) if a != b]
    assert diff == [("import onnxruntime as ort", "import graphfuse as ort")]

    ort_log, ort_out = _run(SCRIPT, tmp_path, "ort", model)
    gf_log, gf_out = _run(str(script), tmp_path, "gf", model)
    assert sorted(gf_out) == sorted(ort_out)
    for key, want in ort_out.items():
        np.testing.assert_allclose(gf_out[key], want, rtol=RTOL, atol=ATOL, err_msg=key)
    # Every way of running gives the session's run() outputs.
    first = next(k for k in gf_out if k.startswith("run/"))
    for key in ("run_one", "ortvalue", "iobinding"):
        np.testing.assert_array_equal(gf_out[key], gf_out[first], err_msg=key)

    def line(log, head):
        return next(l for l in log.splitlines() if l.startswith(head + " "))

    assert line(gf_log, "model") == line(ort_log, "model")
    assert "ort-script-test" in line(gf_log, "model")
    for l in [l for l in ort_log.splitlines() if l.startswith("input ")]:
        assert l in gf_log.splitlines()

    # The profile: one "run" event per call (run, run of one output, OrtValues, io_binding), each
    # with one event per kernel of the plan, named by its node; fused kernels name their members.
    profile = os.path.join(tmp_path, line(gf_log, "profile").split()[1])
    with open(profile) as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    runs = [e for e in events if e["cat"] == "run"]
    assert len(runs) == 4
    plans = [e for e in events if e["cat"] == "planning"]
    assert len(plans) == 1 and runs[0]["args"]["planned"] and not any(r["args"]["planned"] for r in runs[1:])
    sess = gf.InferenceSession(model, providers=["CPUExecutionProvider"])
    sizes = {"batch": 2, "batch_size": 2, "sequence": 7, "sequence_length": 7, "seq": 7}  # as the script's
    feeds = {a.name: np.zeros([d if isinstance(d, int) else sizes.get(d, 3) for d in a.shape], dtype=np.int64)
             for a in sess.get_inputs()}
    report = sess.explain(feeds)
    assert runs[0]["args"]["signature"] == report["signature"]
    kernels = [e for e in events if e["cat"] not in ("run", "planning")]
    assert len(kernels) == 4 * report["launches_per_run"]
    for run in runs:
        inside = [k for k in kernels if run["ts"] <= k["ts"] and k["ts"] + k["dur"] <= run["ts"] + run["dur"] + 1e-3]
        assert len(inside) == report["launches_per_run"], run
    by_name = {k["name"]: k for k in kernels}
    for group in report["groups"]:
        event = by_name[group["name"]]
        assert event["args"]["members"] == group["nodes"], group["name"]
        assert event["args"]["kernel_name"] == group["kernel_name"]
        assert event["args"]["bytes"] > 0
    engines = {c["node"]: c["how"] for c in report["kernel_choices"]}
    assert engines, "the GEMMs' engines"
    for node, how in engines.items():
        assert by_name[node]["args"]["engine"] == how, node


def test_unsupported_onnxruntime_features_are_named():
    import graphfuse as ort

    with pytest.raises(ort.Unimplemented, match="onnxruntime's SparseTensor"):
        ort.SparseTensor
    assert not hasattr(ort, "OrtDevice")  # hasattr probes answer False, they do not raise
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        ort.NoSuchThing
    sess = ort.InferenceSession(model_path("hf/gpt2_ts_dynamic"))
    with pytest.raises(NotImplementedError, match="onnxruntime's InferenceSession.run_async"):
        sess.run_async
    with pytest.raises(ort.Unimplemented, match="set_providers to another backend"):
        sess.set_providers(["CUDAExecutionProvider"])
    so = ort.SessionOptions()
    so.optimized_model_filepath = "optimized.onnx"
    with pytest.raises(ort.Unimplemented, match="optimized_model_filepath"):
        ort.InferenceSession(model_path("hf/gpt2_ts_dynamic"), sess_options=so)
    assert sess.end_profiling() == ""  # not profiling: as onnxruntime
    assert sess.get_profiling_start_time_ns() == 0
    assert sess.get_overridable_initializers() == []
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    assert isinstance(sess.get_session_options(), ort.SessionOptions)
    assert set(ort.get_available_providers()) <= set(ort.get_all_providers())
    assert ort.__version__ in ort.get_build_info()
