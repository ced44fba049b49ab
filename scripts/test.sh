#!/usr/bin/env bash
# Builds graphfuse and runs every test (the README's test command): the C++ tests (ctest), then
# the Python package's (scripts/test_python.sh: pip install . into the project's venv, pytest).
# Exit status: the first that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
bash scripts/test_python.sh
