#!/usr/bin/env bash
# Builds the Python package (pip install .) into a venv of its own and runs its tests
# (python/tests). Exit status = pytest's.
#
#   scripts/test_python.sh                  # venv in build-pyvenv
#   GF_PY_VENV=/path/to/venv scripts/test_python.sh
#
# The C++ build lives in build-python and is kept between runs, so a rerun only compiles
# what changed (ccache, when installed, also serves objects the plain CMake build compiled).
# Needs the system packages scripts/setup.sh installs, and python3 with venv.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=${GF_PY_VENV:-build-pyvenv}
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
config=(-C build-dir=build-python)
if command -v ccache >/dev/null; then
  config+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$(date +%s)
"$venv/bin/python" -m pip install "${config[@]}" ".[test]"
echo "pip install: $(( $(date +%s) - start )) s"
"$venv/bin/python" -m pytest -q python/tests "$@"
