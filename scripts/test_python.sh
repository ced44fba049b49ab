#!/usr/bin/env bash
# Builds the Python package (pip install .) into the project's Python venv and runs its tests
# (python/tests: sessions, the torch.compile backend, tensor parallelism over gloo). Exit status =
# pytest's. scripts/test.sh runs it after the C++ tests.
#
#   scripts/test_python.sh                  # venv: $GF_VENV, else ~/.cache/graphfuse/venv
#   scripts/test_python.sh -k torch         # extra arguments go to pytest
#
# tools/setup_venv.sh makes the venv with the pinned torch, transformers and onnx (about 5
# minutes and 3 GB on a fresh machine: PyPI's torch wheel brings the CUDA libraries; nothing when
# every pin is there). pip then builds the C++ library and the extension in build-python (about
# 4 minutes cold on 2 cores; ccache, when installed, serves what is unchanged).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GF_VENV:-${HOME}/.cache/graphfuse/venv}
start=$(date +%s)
bash tools/setup_venv.sh "$venv"
echo "python venv: $(( $(date +%s) - start )) s"
config=(-C build-dir=build-python)
if command -v ccache >/dev/null; then
  config+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$(date +%s)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${config[@]}" .
echo "pip install .: $(( $(date +%s) - start )) s"
# The wheel, from the same build: it must carry the extension and the torch.compile entry point.
rm -rf build-python/wheel
"$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps "${config[@]}" -w build-python/wheel .
"$venv/bin/python" - build-python/wheel/graphfuse-*.whl <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.startswith("graphfuse/_graphfuse") and n.endswith(".so") for n in names), names
ep = next(n for n in names if n.endswith("entry_points.txt"))
assert "graphfuse = graphfuse.torch_backend:graphfuse_backend" in zipfile.ZipFile(sys.argv[1]).read(ep).decode(), ep
print("wheel:", sys.argv[1].split("/")[-1], len(names), "files")
PY
# The tests import the installed package, not the source tree.
cd python/tests
GRAPHFUSE_REQUIRE_TORCH=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
