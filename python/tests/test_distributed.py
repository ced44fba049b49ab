"""A tensor-parallel MLP under torch.distributed (gloo, 2 processes on this machine), each rank
compiled with backend="graphfuse": the all_reduce stays in PyTorch, graphfuse runs the compute
on either side, and every rank's output matches the single-process MLP."""

import os
import subprocess
import sys

import pytest

if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tp_worker  # noqa: E402


def test_tensor_parallel_mlp_over_gloo(tmp_path):
    world = 2
    init_file = tmp_path / "rendezvous"
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "tp_worker.py"), str(rank), str(world), str(init_file), str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(world)
    ]
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank did not finish in 240 s")
        logs.append(out)
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-4000:]}"

    w = tp_worker.full_weights()
    h = torch.nn.functional.gelu(torch.nn.functional.linear(w["x"], w["w1"], w["b1"]) * 1.5 - 0.25)
    expected = torch.tanh(torch.nn.functional.linear(h, w["w2"], w["b2"])) * 2.0
    for rank in range(world):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(result["out"], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["again"], result["out"], rtol=0, atol=0)
        reports = result["reports"]
        assert reports, f"rank {rank}: graphfuse compiled nothing"
        partitions = [p for r in reports for p in r["partitions"]]
        assert len(partitions) >= 2, f"rank {rank}: graphfuse ran {partitions}; expected the compute on both sides"
        fallback = {op for r in reports for op in r["fallback"]}
        # Dynamo traces the collective into the graph; it stays there, run by PyTorch.
        assert "_c10d_functional.all_reduce.default" in fallback, fallback
