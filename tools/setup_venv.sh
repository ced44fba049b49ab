#!/usr/bin/env bash
# Creates the project's Python virtual environment, with the exact versions pinned in
# tools/requirements.txt: the Python tests (scripts/test_python.sh, which CI runs), the
# transformers corpus export (tools/export_hf_corpus.py) and the Python peers run in it.
#
#   bash tools/setup_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to $GF_VENV, else ~/.cache/graphfuse/venv. The interpreter is $PYTHON, else
# python3 (3.10 or newer). Everything comes from PyPI, whose Linux torch wheel brings the CUDA
# libraries with it: about 3 GB to fetch and 5 minutes on a fresh machine; the CPU runs use none
# of them. onnxruntime is optional: if it cannot be installed, only the export's --check-ort and
# the onnxruntime peer are unavailable. Re-running with every pin installed does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="${here}/requirements.txt"
venv="${1:-${GF_VENV:-${HOME}/.cache/graphfuse/venv}}"
python="${PYTHON:-python3}"

pin() {  # pin NAME -> the version pinned for NAME in the requirements file
  sed -n "s/^$1==\([^[:space:]]*\).*/\1/p" "${req}"
}

# Prints the requirements whose pinned version is not installed in the venv, one a line.
missing() {
  "${venv}/bin/python" - "${req}" <<'PY'
import sys
from importlib import metadata
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    # A local label (torch's "+cpu") does not change the release pinned.
    if have is None or have.split("+", 1)[0] != want:
        print(name)
PY
}

if [[ ! -x "${venv}/bin/python" ]]; then
  "${python}" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
    || { echo "error: ${python} is older than 3.10" >&2; exit 1; }
  echo "creating ${venv} with $("${python}" --version)"
  mkdir -p "$(dirname "${venv}")"
  "${python}" -m venv "${venv}"
fi

todo="$(missing)"
if [[ -z "${todo}" ]]; then
  echo "${venv}: every pin in ${req} is installed; nothing to do"
  exit 0
fi
echo "to install: $(echo ${todo})"

pip=("${venv}/bin/python" -m pip install --disable-pip-version-check)
grep -v '^onnxruntime==' "${req}" | "${pip[@]}" -r /dev/stdin
ort_pin="onnxruntime==$(pin onnxruntime)"
"${pip[@]}" "${ort_pin}" \
  || echo "warning: ${ort_pin} did not install; --check-ort is unavailable" >&2

todo="$(missing)"
if [[ -n "${todo}" ]]; then
  echo "warning: not installed at the pinned version: $(echo ${todo})" >&2
  grep -qx -e torch -e transformers -e onnx -e pytest -e numpy <<<"${todo}" && exit 1
fi
"${venv}/bin/python" -c 'import torch, transformers, onnx, onnxscript; print("torch", torch.__version__, "transformers", transformers.__version__, "onnx", onnx.__version__, "onnxscript", onnxscript.__version__)'
