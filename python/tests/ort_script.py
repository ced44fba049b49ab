"""A typical onnxruntime inference script, as users write it. test_ort_script.py runs it as it is
(with onnxruntime) and with only its import line changed to graphfuse, and compares what the two
write.

    python ort_script.py MODEL.onnx OUT.npz PROFILE_PREFIX
"""

import json
import sys

import numpy as np
import onnxruntime as ort

model_path, out_path, profile_prefix = sys.argv[1:4]

print("version", ort.__version__, "device", ort.get_device())
assert "CPUExecutionProvider" in ort.get_available_providers()

so = ort.SessionOptions()
so.intra_op_num_threads = 2
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.log_severity_level = 3
so.enable_profiling = True
so.profile_file_prefix = profile_prefix
sess = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
print("providers", sess.get_providers())

meta = sess.get_modelmeta()
print("model", meta.producer_name, meta.graph_name, meta.domain, meta.version, meta.custom_metadata_map)

# Random inputs of the declared types; symbolic dims take fixed sizes.
sizes = {"batch": 2, "batch_size": 2, "sequence": 7, "sequence_length": 7, "seq": 7}
rng = np.random.default_rng(0)
feeds = {}
for arg in sess.get_inputs():
    shape = [d if isinstance(d, int) else sizes.get(d, 3) for d in arg.shape]
    if arg.type == "tensor(int64)":
        feeds[arg.name] = rng.integers(0, 50, size=shape).astype(np.int64)
    elif arg.type == "tensor(float)":
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    else:
        raise SystemExit(f"input {arg.name}: type {arg.type} not handled by this script")
    print("input", arg.name, arg.type, arg.shape, "->", shape)
output_names = [o.name for o in sess.get_outputs()]

results = {}
ro = ort.RunOptions()
ro.log_severity_level = 3
outs = sess.run(None, feeds, ro)
for name, value in zip(output_names, outs):
    results[f"run/{name}"] = value
first = sess.run([output_names[0]], feeds)[0]
results["run_one"] = first

# OrtValues in, OrtValues out.
ort_feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
ort_outs = sess.run_with_ort_values(output_names, ort_feeds)
assert list(ort_outs[0].shape()) == list(outs[0].shape), (ort_outs[0].shape(), outs[0].shape)
results["ortvalue"] = ort_outs[0].numpy()

# io_binding: inputs bound as OrtValues and arrays, outputs left to the session.
binding = sess.io_binding()
for k, (name, value) in enumerate(feeds.items()):
    if k % 2:
        binding.bind_cpu_input(name, value)
    else:
        binding.bind_ortvalue_input(name, ort_feeds[name])
for name in output_names:
    binding.bind_output(name, "cpu")
sess.run_with_iobinding(binding)
results["iobinding"] = binding.copy_outputs_to_cpu()[0]

profile = sess.end_profiling()
with open(profile) as f:
    trace = json.load(f)
events = trace["traceEvents"] if isinstance(trace, dict) else trace
timed = [e for e in events if e.get("ph") == "X"]
print("profile", profile, len(timed), "timed events")
assert timed, "the profile has no timed events"

np.savez(out_path, **results)
print("wrote", out_path)
