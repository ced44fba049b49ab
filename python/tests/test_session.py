"""Dynamic shapes, input layouts, explain(), errors and threads of graphfuse.InferenceSession."""

import os
import threading
import warnings

import numpy as np
import pytest

import graphfuse as gf
from conftest import assert_outputs_match, data_sets, feeds, model_path

DYNAMIC = "hf/gpt2_ts_dynamic"


def test_dynamic_shapes_one_session():
    session = gf.InferenceSession(model_path(DYNAMIC))
    sets = data_sets(DYNAMIC)
    shapes = {tuple(inputs[0].shape) for inputs, _ in sets}
    assert len(shapes) >= 2, shapes
    assert session.explain() is None  # nothing planned before the first run
    prepared, seen = None, set()
    for _ in range(2):  # the second round finds every plan in the cache
        for inputs, expected in sets:
            assert_outputs_match(DYNAMIC, session.run(None, feeds(session, inputs)), expected)
            assert session.explain()["signature"].startswith(f"i64[{','.join(map(str, inputs[0].shape))}]")
            stats = session.cache_stats()
            assert (stats["last_planning_ms"] == 0) == (tuple(inputs[0].shape) in seen), stats
            seen.add(tuple(inputs[0].shape))
            # The weights the plans derive (GPT-2's fused projections, packed panels) are made by
            # the first plan and shared by every later one, whatever its shapes.
            prepared = prepared or (stats["prepared_entries"], stats["prepared_bytes"])
            assert (stats["prepared_entries"], stats["prepared_bytes"]) == prepared
            assert session.explain()["prepared_bytes"] == prepared[1]
    assert prepared[1] > 0
    stats = session.cache_stats()
    assert stats["plans_made"] == len(shapes) == session.explain()["plans_made"]
    assert stats["hits"] == 2 * len(sets) - len(shapes)


def test_non_contiguous_and_foreign_layouts():
    name = "mlp_gelu_opset17"
    session = gf.InferenceSession(model_path(name))
    inputs, expected = data_sets(name)[0]
    x = inputs[0]
    variants = [
        np.asfortranarray(x),
        np.repeat(x, 2, axis=-1)[..., ::2],  # strided view
        x.astype(x.dtype.newbyteorder(">")),  # big-endian
        x.tolist(),  # nested lists
    ]
    for v in variants:
        assert_outputs_match(name, session.run(None, {session.get_inputs()[0].name: v}), expected)


def test_read_only_input():
    name = "mlp_gelu_opset17"
    session = gf.InferenceSession(model_path(name))
    inputs, expected = data_sets(name)[0]
    x = inputs[0].copy()
    x.setflags(write=False)
    assert_outputs_match(name, session.run(None, {session.get_inputs()[0].name: x}), expected)


def test_outputs_are_owned_numpy_arrays():
    name = "mlp_gelu_opset17"
    session = gf.InferenceSession(model_path(name))
    inputs, expected = data_sets(name)[0]
    first = session.run(None, feeds(session, inputs))[0]
    second = session.run(None, feeds(session, inputs))[0]
    assert isinstance(first, np.ndarray) and first.flags.c_contiguous
    assert not np.shares_memory(first, second)
    first[...] = 0  # writable, and the session's next run is unaffected
    assert_outputs_match(name, [second], expected)


def test_explain_report():
    session = gf.InferenceSession(model_path("llama_block_opset17"))
    report = session.explain()  # static: planned at construction
    assert set(report) >= {"kernels_before", "kernels_after", "groups", "refusals", "signature", "launches_per_run"}
    assert 0 < report["kernels_after"] < report["kernels_before"]
    assert report["groups"], report
    for g in report["groups"]:
        assert g["name"] and g["kind"] and g["nodes"], g
        assert all(isinstance(n, str) and n for n in g["nodes"])
    kinds = {g["kind"] for g in report["groups"]}
    assert "elementwise" in kinds or len(kinds) > 1, kinds
    for r in report["refusals"]:
        assert set(r) == {"producer", "consumer", "code", "message"}
        assert r["code"] and r["message"] and r["producer"]
    unfused = gf.InferenceSession(model_path("llama_block_opset17"), fusion=False).explain()
    assert unfused["groups"] == []
    assert unfused["kernels_after"] > report["kernels_after"]


def test_explain_names_the_gemm_engines():
    # On the CPU every GEMM against constant weights says which engine runs it and why: the test
    # block's 16 rows take the own f32 tiles; with bf16 weights the engine depends on the CPU (the
    # own bf16 dot products with AVX512-BF16, oneDNN's bf16 matmul with AMX, the own tiles widening
    # the weights where neither has bf16 instructions), and every GEMM of the block names the same.
    bf16_engines = ("own bf16 dot-product tiles", "oneDNN bf16 matmul", "own tiles, bf16 weights widened")
    for bf16, engines in [(False, ("own tiles: ",)), (True, bf16_engines)]:
        report = gf.InferenceSession(model_path("llama_block_opset17"), bf16_weights=bf16).explain()
        choices = report["kernel_choices"]
        assert {c["op"] for c in choices} == {"FusedAttention", "FusedGemm"}, choices
        named = {e for c in choices for e in engines if e in c["how"]}
        assert len(named) == 1, choices
        (engine,) = named
        for c in choices:
            assert c["node"] and engine in c["how"], c
            assert ("bf16 weights" if bf16 else "f32 weights") in c["how"], c


def test_explain_for_feeds_plans_without_running():
    session = gf.InferenceSession(model_path(DYNAMIC))
    inputs, _ = data_sets(DYNAMIC)[2]
    report = session.explain(feeds(session, inputs))
    assert report["signature"].startswith(f"i64[{','.join(map(str, inputs[0].shape))}]")
    assert report["kernels_after"] < report["kernels_before"]
    assert session.cache_stats()["plans_made"] == 1


def test_errors_name_the_input():
    session = gf.InferenceSession(model_path(DYNAMIC))
    ids = np.zeros((1, 3), np.int64)
    mask = np.ones((1, 3), np.int64)
    cases = [
        ({"input_ids": ids.astype(np.float32), "attention_mask": mask}, "input_ids"),  # a dtype graphfuse has
        ({"input_ids": ids, "attention_mask": mask.astype(np.float64)}, "attention_mask"),  # one it lacks
        ({"input_ids": ids.reshape(1, 3, 1), "attention_mask": mask}, "input_ids"),  # rank
        ({"input_ids": ids, "attention_mask": np.ones((1, 4), np.int64)}, "attention_mask"),  # 'seq' twice
        ({"input_ids": ids}, "attention_mask"),  # missing
        ({"input_ids": ids, "attention_mask": mask, "extra": mask}, "extra"),  # unknown
    ]
    for feed, culprit in cases:
        with pytest.raises(gf.InvalidArgument, match=f"'{culprit}'"):
            session.run(None, feed)
    with pytest.raises(ValueError, match="'nope'"):  # InvalidArgument is a ValueError
        session.run(["nope"], {"input_ids": ids, "attention_mask": mask})
    # The session stays usable after every error.
    inputs, expected = data_sets(DYNAMIC)[0]
    assert_outputs_match(DYNAMIC, session.run(None, feeds(session, inputs)), expected)


def test_static_model_refuses_another_shape():
    session = gf.InferenceSession(model_path("mlp_gelu_opset17"))
    arg = session.get_inputs()[0]
    bad = np.zeros([d + 1 for d in arg.shape], np.float32)
    with pytest.raises(gf.InvalidArgument, match=f"'{arg.name}'"):
        session.run(None, {arg.name: bad})


def test_load_errors():
    with pytest.raises(gf.NotFound, match="no_such_model.onnx"):
        gf.InferenceSession("/nonexistent/no_such_model.onnx")
    with pytest.raises(gf.InvalidArgument, match="not a valid ONNX model"):
        gf.InferenceSession(b"not a model")
    with pytest.raises(ValueError, match="provider"):
        gf.InferenceSession(model_path(DYNAMIC), providers=["TensorrtExecutionProvider"])
    with pytest.raises(gf.Error):
        gf.InferenceSession(model_path(DYNAMIC), backend="tpu")
    assert issubclass(gf.InvalidArgument, gf.Error) and issubclass(gf.InvalidArgument, ValueError)


def test_providers_and_options():
    session = gf.InferenceSession(model_path(DYNAMIC), providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"] and session.backend == "cpu"
    options = gf.SessionOptions()
    options.intra_op_num_threads = 1
    single = gf.InferenceSession(model_path(DYNAMIC), options, providers=[("CPUExecutionProvider", {})])
    inputs, expected = data_sets(DYNAMIC)[1]
    assert_outputs_match(DYNAMIC, single.run(None, feeds(single, inputs)), expected)
    assert "CPUExecutionProvider" in gf.get_available_providers()


def test_onnxruntime_names_scripts_touch():
    # As an onnxruntime script writes them, with only the import changed.
    import graphfuse as ort

    assert isinstance(ort.__version__, str) and ort.__version__[0].isdigit()
    assert ort.get_device() in ("CPU", "GPU")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model_path(DYNAMIC), sess_options=so, providers=["CPUExecutionProvider"])
    ro = ort.RunOptions()
    ro.log_severity_level = 3
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    inputs, expected = data_sets(DYNAMIC)[1]
    assert_outputs_match(DYNAMIC, sess.run(None, feeds(sess, inputs), ro), expected)
    fused = sess.explain()
    assert fused["kernels_after"] < fused["kernels_before"]
    # ORT_DISABLE_ALL: the unfused baseline, the same outputs.
    off = ort.SessionOptions()
    off.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ort.InferenceSession(model_path(DYNAMIC), sess_options=off, providers=["CPUExecutionProvider"])
    assert_outputs_match(DYNAMIC, unfused.run(None, feeds(unfused, inputs)), expected)
    report = unfused.explain()
    assert report["kernels_after"] == report["kernels_before"]
    ro.terminate = True
    with pytest.raises(ort.Error, match="RunOptions.terminate"):
        sess.run(None, feeds(sess, inputs), ro)


@pytest.mark.parametrize("threads", [0, 1])
def test_two_python_threads_one_session(threads):
    session = gf.InferenceSession(model_path(DYNAMIC), threads=threads)
    sets = data_sets(DYNAMIC)
    errors = []
    start = threading.Barrier(2)

    def worker(offset):
        try:
            start.wait()
            for i in range(12):
                inputs, expected = sets[(i + offset) % len(sets)]
                assert_outputs_match(DYNAMIC, session.run(None, feeds(session, inputs)), expected)
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    # Two threads meeting a new signature at once may both plan it.
    assert session.cache_stats()["plans_made"] <= 2 * len(sets)


def _has_gpu() -> bool:
    try:
        gf.InferenceSession(model_path("mlp_gelu_opset17"), backend="cuda")
        return True
    except (gf.NotFound, ValueError):
        return False


@pytest.mark.skipif("cuda" not in gf.get_available_backends(), reason="built without the CUDA toolkit")
def test_cuda_backend_emulated_and_provider_fallback():
    """The CUDA backend's plan, run on the host (emulate_gpu), matches the stored references; a
    provider list starting with CUDA gives way to the CPU where no GPU can start."""
    name = "mlp_gelu_opset17"
    emulated = gf.InferenceSession(model_path(name), backend="cuda", emulate_gpu=True)
    assert emulated.backend == "cuda"
    for inputs, expected in data_sets(name):
        assert_outputs_match(name, emulated.run(None, feeds(emulated, inputs)), expected)
    assert emulated.explain()["kernels_after"] < emulated.explain()["kernels_before"]
    gpu = _has_gpu()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = gf.InferenceSession(model_path(name), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.backend == ("cuda" if gpu else "cpu")
    assert gpu or any("unavailable" in str(w.message) for w in caught)
    if not gpu:
        with pytest.raises(gf.NotFound, match="CUDA"):
            gf.InferenceSession(model_path(name), providers=["CUDAExecutionProvider"])


@pytest.mark.parametrize("name", ["llama_block_opset17", "hf/llama_ts_kv"])
def test_bf16_weights_on_the_cpu(name):
    # The GEMMs' weights rounded to bf16: the stored float64-checked references within the bf16
    # tolerance of the accuracy contract, and not the f32 session's bits (the option acts).
    f32 = gf.InferenceSession(model_path(name), threads=2)
    bf16 = gf.InferenceSession(model_path(name), threads=2, bf16_weights=True)
    for inputs, expected in data_sets(name):
        want = f32.run(None, feeds(f32, inputs))
        got = bf16.run(None, feeds(bf16, inputs))
        for k, (g, w, e) in enumerate(zip(got, want, expected)):
            np.testing.assert_allclose(g, e.astype(g.dtype), rtol=5e-2, atol=5e-2, err_msg=f"{name} output {k}")
        assert any(not np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_dtype_bf16_on_every_backend_that_runs_it(backend):
    # One option for every backend, as the backend runs bf16: on the CPU the GEMM weights in bf16,
    # on the CUDA backend (emulated on the host here) the model converted to bf16. Both within the
    # bf16 tolerance of the float64-checked references, neither with the f32 session's bits.
    if backend not in gf.get_available_backends():
        pytest.skip(f"this build has no {backend} backend")
    name = "llama_block_opset17"
    options = {"emulate_gpu": True} if backend == "cuda" else {}
    f32 = gf.InferenceSession(model_path(name), backend=backend, threads=2, **options)
    bf16 = gf.InferenceSession(model_path(name), backend=backend, threads=2, dtype="bf16", **options)
    for inputs, expected in data_sets(name)[:1]:
        want = f32.run(None, feeds(f32, inputs))
        got = bf16.run(None, feeds(bf16, inputs))
        for k, (g, w, e) in enumerate(zip(got, want, expected)):
            assert g.dtype == w.dtype  # the model's declared types, whatever it computes in
            np.testing.assert_allclose(g, e.astype(g.dtype), rtol=5e-2, atol=5e-2, err_msg=f"{backend} output {k}")
        assert any(not np.array_equal(g, w) for g, w in zip(got, want))


def test_a_dtype_the_backend_does_not_run_is_refused_naming_it():
    with pytest.raises(gf.Unimplemented, match="f16 needs the cuda target"):
        gf.InferenceSession(model_path("llama_block_opset17"), backend="cpu", dtype="f16")
    with pytest.raises(gf.InvalidArgument, match="dtype"):
        gf.InferenceSession(model_path("llama_block_opset17"), dtype="f64x")


def test_decode_lengths_of_one_shape_class_match_per_shape_plans():
    """A decode loop over a growing cache: after the class's first three lengths, plans come
    from its template, and every output equals a session that plans every length."""
    name = "hf/llama_ts_kv"
    classes = gf.InferenceSession(model_path(name), threads=1)
    per_shape = gf.InferenceSession(model_path(name), threads=1, shape_classes=False)
    past_inputs = [i for i in classes.get_inputs() if i.name.startswith("past")]
    heads, head_dim = past_inputs[0].shape[1], past_inputs[0].shape[3]
    rng = np.random.default_rng(3)
    for past in range(4, 14):
        feed = {
            "input_ids": rng.integers(0, 150, (1, 1), dtype=np.int64),
            "attention_mask": np.ones((1, past + 1), np.int64),
            "position_ids": np.array([[past]], np.int64),
        }
        for i in past_inputs:
            feed[i.name] = rng.standard_normal((1, heads, past, head_dim)).astype(np.float32)
        got, want = classes.run(None, feed), per_shape.run(None, feed)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        assert classes.explain()["from_template"] == (past >= 7)
    stats = classes.cache_stats()
    assert (stats["plans_from_template"], stats["shape_classes"]) == (7, 1), stats
    assert per_shape.cache_stats()["plans_from_template"] == 0


def _greedy_feeds(sess, ids, past):
    return {
        "input_ids": ids,
        "attention_mask": np.ones((1, past + ids.shape[1]), np.int64),
        "position_ids": np.arange(past, past + ids.shape[1], dtype=np.int64)[None, :],
    }


def test_kv_cache_kept_in_place_with_io_binding():
    """Greedy generation with each present bound onto its past's buffer (capacity preallocated,
    onnxruntime's io_binding): the same tokens and logits as run() returning new presents, the
    presents are views of the caches, the plan writes them in place, and rows past the latest
    token stay unwritten."""
    name = "hf/llama_ts_kv"
    sess = gf.InferenceSession(model_path(name), threads=1)
    past_names = [i.name for i in sess.get_inputs() if i.name.startswith("past")]
    present_names = [o.name for o in sess.get_outputs() if o.name.startswith("present")]
    heads, head_dim = sess.get_inputs()[3].shape[1], sess.get_inputs()[3].shape[3]
    prompt, new, capacity = 5, 10, 24
    caches = {p: np.full((1, heads, capacity, head_dim), np.nan, np.float32) for p in past_names}
    ids = np.random.default_rng(11).integers(0, 150, (1, prompt), dtype=np.int64)

    # The plain loop: run() returns new presents, fed back as the next pasts.
    feed = _greedy_feeds(sess, ids, 0)
    feed.update({p: np.zeros((1, heads, 0, head_dim), np.float32) for p in past_names})
    plain_tokens, plain_logits = [], []
    for step in range(new):
        out = sess.run(None, feed)
        token = int(out[0][0, -1].argmax())
        plain_tokens.append(token)
        plain_logits.append(out[0][0, -1])
        past = feed["attention_mask"].shape[1]
        feed = _greedy_feeds(sess, np.array([[token]], np.int64), past)
        feed.update(dict(zip(past_names, out[1:])))

    binding = sess.io_binding()
    binding.bind_output("logits")
    tokens, length, step_ids = [], 0, ids
    for step in range(new):
        for name, value in _greedy_feeds(sess, step_ids, length).items():
            binding.bind_cpu_input(name, value)
        rows = length + step_ids.shape[1]
        for p, q in zip(past_names, present_names):
            binding.bind_ortvalue_input(p, gf.OrtValue.ortvalue_from_numpy(caches[p][:, :, :length]))
            binding.bind_ortvalue_output(q, gf.OrtValue.ortvalue_from_numpy(caches[p][:, :, :rows]))
        sess.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        logits = outputs[0].numpy()
        np.testing.assert_allclose(logits[0, -1], plain_logits[step], rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
        for p, value in zip(past_names, outputs[1:]):
            assert np.shares_memory(value.numpy(), caches[p])
            assert np.isnan(caches[p][:, :, rows:]).all() and not np.isnan(caches[p][:, :, :rows]).any()
        tokens.append(int(logits[0, -1].argmax()))
        length, step_ids = rows, np.array([[tokens[-1]]], np.int64)
        if step > 0:  # a decode step: the plan takes every past and present in place
            report = sess.explain()
            assert sorted(report["in_place_inputs"]) == sorted(past_names), report["in_place_inputs"]
            assert sorted(report["in_place_outputs"]) == sorted(present_names), report["in_place_outputs"]
    assert tokens == plain_tokens
    # The cache rows are the plain loop's last presents, bit for bit where both copied or wrote them.
    for p, value in zip(past_names, out[1:]):
        np.testing.assert_allclose(caches[p][:, :, :value.shape[2]], value, rtol=1e-5, atol=1e-6)


def test_io_binding_is_onnxruntimes():
    """The onnxruntime surface: OrtValue, bind by array, pointer or name, get_outputs,
    copy_outputs_to_cpu; errors name the input or output."""
    sess = gf.InferenceSession(model_path(DYNAMIC), threads=1)
    (inputs, _), = data_sets(DYNAMIC)[:1]
    want = sess.run(None, feeds(sess, inputs))
    binding = sess.io_binding()
    for arg, value in zip(sess.get_inputs(), inputs):
        if arg.name == sess.get_inputs()[0].name:
            held = np.ascontiguousarray(value)
            binding.bind_input(arg.name, "cpu", 0, held.dtype, held.shape, held.ctypes.data)
        else:
            binding.bind_ortvalue_input(arg.name, gf.OrtValue.ortvalue_from_numpy(value))
    first = sess.get_outputs()[0]
    out = gf.OrtValue.ortvalue_from_shape_and_type(want[0].shape, np.float32)
    binding.bind_ortvalue_output(first.name, out)
    for o in sess.get_outputs()[1:]:
        binding.bind_output(o.name)
    sess.run_with_iobinding(binding)
    got = binding.copy_outputs_to_cpu()
    assert binding.get_outputs()[0].numpy() is out.numpy()
    assert out.shape() == list(want[0].shape) and out.data_type() == "tensor(float)"
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(gf.InvalidArgument, match="no output named 'nope'"):
        binding.bind_output("nope")
    with pytest.raises(gf.InvalidArgument, match="no input named 'nope'"):
        binding.bind_cpu_input("nope", inputs[0])
    with pytest.raises(gf.Unimplemented, match="host memory"):
        binding.bind_output(first.name, "cuda")
    wrong = gf.OrtValue.ortvalue_from_shape_and_type([1, 2], np.float32)
    binding.bind_ortvalue_output(first.name, wrong)
    with pytest.raises(gf.InvalidArgument, match=first.name):
        sess.run_with_iobinding(binding)
    binding.clear_binding_inputs()
    with pytest.raises(gf.InvalidArgument, match="is not bound"):
        sess.run_with_iobinding(binding)


EXTERNAL = "external_data_opset17"


def test_external_data_from_a_path_and_from_bytes_with_its_folder():
    """Weights in model.onnx.data: read from the model's folder for a path; for bytes, from
    external_data_folder (or onnxruntime's session config entry); refused without it."""
    [(inputs, expected)] = data_sets(EXTERNAL)
    path = model_path(EXTERNAL)
    folder = os.path.dirname(path)
    with open(path, "rb") as f:
        model_bytes = f.read()
    options = gf.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    for session in (
        gf.InferenceSession(path),
        gf.InferenceSession(model_bytes, external_data_folder=folder),
        gf.InferenceSession(model_bytes, sess_options=options),
    ):
        assert_outputs_match(EXTERNAL, session.run(None, feeds(session, inputs)), expected)
        assert session.explain()["kernels_after"] < session.explain()["kernels_before"]
    with pytest.raises(gf.InvalidArgument, match="initializer 'W'.*model.onnx.data"):
        gf.InferenceSession(model_bytes)
    with pytest.raises(gf.InvalidArgument, match="leaves the model's folder"):
        gf.InferenceSession(os.path.join(folder, "outside", "model.onnx"))


def test_default_dynamo_export_with_external_data(tmp_path):
    """torch.onnx.export(model, args, path, dynamo=True) with every other argument at its default
    writes the weights to model.onnx.data; the session runs it fused and matches torch."""
    if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") != "1":
        pytest.importorskip("torch")
        pytest.importorskip("onnxscript")
    import torch

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(3, 64)
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=True)
    assert os.path.exists(path + ".data"), os.listdir(tmp_path)
    session = gf.InferenceSession(path, threads=1)
    [got] = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    report = session.explain()
    assert report["kernels_after"] < report["kernels_before"], report


def test_set_progress_tells_of_the_gemm_timing(tmp_path, monkeypatch):
    # On an empty GEMM cache the first plan times the MatMul's shape class (1 MiB of f32 weights:
    # the least that is timed) and tells the callable first; a second session finds it cached.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.setenv("GF_KERNEL_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 512])], [w])
    path = str(tmp_path / "mm.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    lines = []
    gf.set_progress(lines.append)
    try:
        y = gf.InferenceSession(path, threads=2).run(None, {"x": x})[0]
        assert len(lines) == 1 and "512x512 f32 weights at 8 rows" in lines[0], lines
        assert str(tmp_path / "cache") in lines[0], lines
        gf.InferenceSession(path, threads=2).run(None, {"x": x})
        assert len(lines) == 1, lines  # cached: nothing timed, nothing told
    finally:
        gf.set_progress(None)
    np.testing.assert_allclose(y, x.astype(np.float64) @ numpy_helper.to_array(w).astype(np.float64),
                               rtol=1e-4, atol=1e-3)
    with pytest.raises(TypeError, match="callable"):
        gf.set_progress(3)


def test_a_progress_callback_may_replace_itself(tmp_path, monkeypatch):
    # The sink is called outside the lock that guards it: a callback that clears the sink (or a
    # thread replacing it while a compile waits for the GIL) does not deadlock.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.setenv("GF_KERNEL_CACHE", str(tmp_path / "cache"))
    w = numpy_helper.from_array(np.ones((512, 1024), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1024])], [w])
    path = str(tmp_path / "mm.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    lines = []

    def once(line):
        lines.append(line)
        gf.set_progress(None)

    gf.set_progress(once)
    try:
        y = gf.InferenceSession(path, threads=2).run(None, {"x": np.ones((2, 512), np.float32)})[0]
    finally:
        gf.set_progress(None)
    assert len(lines) == 1 and "512x1024 f32 weights at 2 rows" in lines[0], lines
    np.testing.assert_allclose(y, np.full((2, 1024), 512.0), rtol=1e-6)
