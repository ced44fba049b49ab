"""bench/peers/cpu_peers.py runs end to end on a shrunken GPT-2 block: export to ONNX, graphfuse,
onnxruntime, torch.compile and eager each built, checked against eager and timed; the table
and the JSON come out. (The figures of a real run are recorded in bench/RESULTS.md.)"""

import json
import os
import subprocess
import sys

import pytest

if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers", "cpu_peers.py")


def test_cpu_peers_tiny_gpt2(tmp_path):
    out = tmp_path / "peers.json"
    cmd = [sys.executable, SCRIPT, "--blocks", "gpt2", "--tiny", "--rounds", "1", "--repeats", "1",
           "--threads", "1", "--cache-dir", str(tmp_path / "onnx"), "--json", str(out)]
    # The script imports graphfuse as this process does (the installed package).
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "| gpt2 seq 16 tiny" in r.stdout, r.stdout[-4000:]
    doc = json.loads(out.read_text())
    assert doc["machine"]["versions"]["onnxruntime"]
    [block] = doc["blocks"]
    assert block["config"]["hidden"] == 64 and block["config"]["seq"] == 16
    assert block["onnx"]["exporter"] == "dynamo" and block["onnx"]["reused"] is False
    for peer in ("graphfuse", "onnxruntime", "torch.compile", "eager"):
        entry = block["peers"][peer]
        assert "error" not in entry, (peer, entry.get("traceback"))
        assert entry["check"]["ok"], (peer, entry["check"])
        assert entry["calls"] == 1 and entry["median_ms"] > 0
    assert block["peers"]["graphfuse"]["check"]["max_abs"] < 1e-4
    assert os.listdir(tmp_path / "onnx"), "the export is kept for reuse"


def test_cpu_peers_tiny_gpt2_bf16(tmp_path):
    # bf16: graphfuse runs the f32 export with bf16 GEMM weights and matches bf16 eager within the
    # bf16 tolerance; onnxruntime (no CPU bf16 GEMM) is recorded as unsupported, not a failure.
    out = tmp_path / "peers.json"
    cmd = [sys.executable, SCRIPT, "--blocks", "gpt2", "--tiny", "--dtype", "bf16", "--rounds", "1", "--repeats", "1",
           "--threads", "1", "--cache-dir", str(tmp_path / "onnx"), "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    [block] = json.loads(out.read_text())["blocks"]
    gf = block["peers"]["graphfuse"]
    assert "error" not in gf, gf.get("traceback")
    assert gf["check"]["ok"] and gf["median_ms"] > 0, gf["check"]
    assert block["onnx_f32"]["exporter"] == "dynamo"
    ort = block["peers"]["onnxruntime"]
    assert "check" in ort or ort.get("unsupported"), ort
