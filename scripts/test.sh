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
# ONNX's node tests as the venv's onnx writes them (today's opsets; ctest's onnx_node_tests reads
# Debian's ONNX 1.12 data, which stops at opset 17).
venv=${GF_VENV:-${HOME}/.cache/graphfuse/venv}
"$venv/bin/python" tools/onnx_node_data.py build/onnx_node_data
GF_ONNX_NODE_DIR=build/onnx_node_data GF_NODE_TESTS_REPORT=build/onnx_node_tests_venv.txt build/tests/onnx_node_tests
head -2 build/onnx_node_tests_venv.txt
