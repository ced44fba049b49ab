#!/usr/bin/env bash
# Installs every Debian package graphfuse needs to build, test and benchmark.
# Idempotent: packages already present are left alone; safe to run as root on a fresh machine.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libsleef-dev libdnnl-dev
  ocl-icd-opencl-dev  # dnnl-config.cmake requires OpenCL; libdnnl-dev only recommends it
  libonnx-dev libprotobuf-dev libonnx-testdata
  clang libclang-rt-14-dev
  python3 python3-numpy python3-venv python3-dev  # python3-dev: the extension module's headers
  python3-onnx  # tests/onnx/make_cli_models.py writes the command-line test's models
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
