#!/usr/bin/env bash
# Installs oneDNN 3.x from PyPI (the OpenMP CPU build: onednn-cpu-gomp and its headers,
# onednn-devel-cpu-gomp, pinned below; Apache-2.0; about 180 MB) into a prefix of its own, for
# building graphfuse against it instead of Debian's libdnnl-dev (oneDNN 2.6, what
# scripts/setup.sh installs and CI builds with). graphfuse's sources build against either; the
# GEMM engine timings (gemm_tuning.h) are keyed by oneDNN's version, so a build against 3.x
# times its engines afresh.
#
#   bash tools/setup_onednn3.sh [PREFIX]      # PREFIX: $GF_ONEDNN3, else ~/.cache/graphfuse/onednn3
#   cmake -S . -B build-onednn3 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=PREFIX
#
# Newer PyPI releases (`onednn` 2024.0 on) are oneDNN's SYCL build: they bring about 2 GB of
# SYCL / OpenCL runtimes under Intel's licences and need OCL_ICD_FILENAMES set to start, and on
# the Xeon VM of bench/RESULTS.md they ran the LLaMA-7B GEMMs no faster than 2.6; 3.2 (the last
# OpenMP build on PyPI) ran them as 2.6 did. bench/history/2026-12.md, 2026-12-07, has the table.
set -euo pipefail

prefix="${1:-${GF_ONEDNN3:-${HOME}/.cache/graphfuse/onednn3}}"
python="${PYTHON:-python3}"
version=2023.2.0  # oneDNN 3.2.0

if [ -f "${prefix}/lib/cmake/dnnl/dnnl-config.cmake" ] &&
   "${prefix}/bin/python" -m pip show onednn-cpu-gomp 2>/dev/null | grep -q "^Version: ${version}$"; then
  echo "setup_onednn3: oneDNN ${version} already in ${prefix}"
else
  "${python}" -m venv "${prefix}"
  "${prefix}/bin/python" -m pip install -q --disable-pip-version-check \
    "onednn-cpu-gomp==${version}" "onednn-devel-cpu-gomp==${version}"
fi
echo "setup_onednn3: configure with -DCMAKE_PREFIX_PATH=${prefix}"
