"""The README's Python quickstart runs as written: each ```python block of its section "Using
graphfuse from Python", executed with only the names it leaves to the reader defined (a model
file, input arrays, a module)."""

import os
import re
import shutil

import numpy as np
import pytest

if os.environ.get("GRAPHFUSE_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")
import torch
import transformers

from conftest import MODELS

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def _python_blocks() -> list[str]:
    text = open(README, encoding="utf-8").read()
    section = re.search(r"^## Using graphfuse from Python\n(.*?)^## ", text, flags=re.S | re.M)
    assert section, "README.md has no section 'Using graphfuse from Python'"
    text = section.group(1)
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_both_quickstarts():
    blocks = _python_blocks()
    assert any("InferenceSession" in b for b in blocks)
    assert any('backend="graphfuse"' in b for b in blocks)
    assert len(blocks) == 2, blocks


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    # What the reader brings: an exported model with input_ids and attention_mask, and a module.
    shutil.copy(os.path.join(MODELS, "hf", "gpt2_ts_dynamic", "model.onnx"), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                                eos_token_id=0)
    ).eval()
    reader = {
        "ids": np.random.randint(0, 64, size=(2, 7)).astype(np.int64),
        "mask": np.ones((2, 7), dtype=np.int64),
        "model": model,
        "input_ids": torch.randint(0, 64, (2, 7)),
    }
    torch._dynamo.reset()
    for block in _python_blocks():
        scope = dict(reader)
        exec(compile(block, "README.md", "exec"), scope)
        if "logits" in scope:  # the session's
            assert scope["logits"].shape[:2] == (2, 7)
        if "outputs" in scope:  # torch.compile's, as eager gives them
            with torch.no_grad():
                torch.testing.assert_close(scope["outputs"].logits, model(reader["input_ids"]).logits)
