#!/usr/bin/env bash
# Creates the Python virtual environment that tools/export_hf_corpus.py runs in, with the
# exact versions pinned in tools/export_requirements.txt.
#
#   bash tools/setup_export_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to $GF_EXPORT_VENV, else /work/.venv-export. The interpreter is $PYTHON,
# else python3 (3.10 or newer). torch comes from the CPU-only wheel index when that index can
# be reached, else from PyPI (whose Linux wheels pull in the CUDA libraries: larger, same
# results on the CPU). onnxruntime is optional: if it cannot be installed the export still
# runs, only --check-ort is unavailable. Re-running with every pin already installed does
# nothing. CI never runs this.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="${here}/export_requirements.txt"
venv="${1:-${GF_EXPORT_VENV:-/work/.venv-export}}"
python="${PYTHON:-python3}"
cpu_index="https://download.pytorch.org/whl/cpu"

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
  "${python}" -m venv "${venv}"
fi

todo="$(missing)"
if [[ -z "${todo}" ]]; then
  echo "${venv}: every pin in ${req} is installed; nothing to do"
  exit 0
fi
echo "to install: $(echo ${todo})"

pip=("${venv}/bin/python" -m pip install --disable-pip-version-check)
if grep -qx torch <<<"${todo}"; then
  torch_pin="torch==$(pin torch)"
  if ! "${pip[@]}" --timeout 30 --retries 1 --index-url "${cpu_index}" "${torch_pin}"; then
    echo "the CPU-only index is not reachable; installing ${torch_pin} from PyPI" >&2
    "${pip[@]}" "${torch_pin}"
  fi
fi
grep -v '^onnxruntime==' "${req}" | "${pip[@]}" -r /dev/stdin
ort_pin="onnxruntime==$(pin onnxruntime)"
"${pip[@]}" "${ort_pin}" \
  || echo "warning: ${ort_pin} did not install; --check-ort is unavailable" >&2

todo="$(missing)"
if [[ -n "${todo}" ]]; then
  echo "warning: not installed at the pinned version: $(echo ${todo})" >&2
fi
"${venv}/bin/python" -c 'import torch, transformers, onnx, onnxscript; print("torch", torch.__version__, "transformers", transformers.__version__, "onnx", onnx.__version__, "onnxscript", onnxscript.__version__)'
