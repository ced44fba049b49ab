#!/usr/bin/env bash
# The transformer-block table of bench/RESULTS.md: every block preset unfused vs fused
# (`graphfuse bench --preset P`, the demo's measurement) and PyTorch eager on the same shapes
# and thread count (bench/peers/block_torch.py; needs bench/peers/setup.sh), in one run.
# Raw outputs go to bench/results/blocks_*.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
GF=${GF:-./build/graphfuse}  # GF=./build-avx2/graphfuse: another build
OUT=bench/results
mkdir -p "$OUT"
REPEATS=${REPEATS:-11}
# Debian's PyTorch runs its GEMMs on Debian's OpenBLAS 0.3.21, which falls back to generic SSE3
# kernels on CPUs it does not know (newer Xeons): name the kernels for the CPU's vector width.
CORE=$(grep -qw avx512f /proc/cpuinfo && echo SkylakeX || echo Haswell)
for spec in "llama7b 32" "llama7b 1" "llama-small 128" "gpt2 128" "bert 128"; do
  set -- $spec
  tag="$1_seq$2"
  echo "== $tag" >&2
  $GF bench --preset "$1" --seq "$2" --threads 2 --repeats "$REPEATS" --profile --json "$OUT/blocks_$tag.json" \
    > "$OUT/blocks_$tag.txt" 2>/dev/null
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    env ${CORE:+OPENBLAS_CORETYPE=$CORE} /usr/bin/python3 bench/peers/block_torch.py --preset "$1" --seq "$2" \
      --threads 2 --repeats "$REPEATS" > "$OUT/blocks_${tag}_torch.json"
  fi
done
/usr/bin/python3 bench/blocks_table.py "$OUT"
