#!/usr/bin/env bash
# The fusion benchmark in one run: `graphfuse bench` presets (unfused, fused on the tile
# executor, fused as native loops (--cpu-codegen) and a same-run STREAM triad, interleaved) at
# 4Ki, 64Ki, 1Mi and 16Mi elements, the Google Benchmark rows of
# fused plans beside hand-written fused loops, then the peers (numpy, numexpr, PyTorch eager)
# from bench/peers/bench_py.py (a copy of the shared anchor script), and a summary table.
#   bench/fusion_bench.sh            everything (~10 minutes on the 2-vCPU VM)
# Needs a build (scripts/test.sh) and, for the peers, Debian's python3-numpy, python3-numexpr
# and python3-torch (bench/peers/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/fusion
mkdir -p "$OUT"
# OpenBLAS picks its AVX2 kernels when these are set here; the peers run without them.
E="env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "commit: $(git rev-parse --short HEAD)"
} > "$OUT/info.txt"
for preset in chain gelu silu residual; do
  for n in 4096 65536 1048576 16777216; do
    echo "graphfuse bench --preset $preset --elements $n" >&2
    $E ./build/graphfuse bench --preset "$preset" --elements "$n" --repeats 21 --cpu-codegen --json "$OUT/$preset-$n.json" > /dev/null
  done
done
if [ -x build/bench/bench_fusion ]; then
  $E ./build/bench/bench_fusion --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.1 --benchmark_out="$OUT/bench_fusion.json" --benchmark_out_format=json > /dev/null
fi
$E /usr/bin/python3 bench/peers/bench_py.py chainA > "$OUT/peers_chainA.txt"
$E /usr/bin/python3 bench/peers/bench_py.py chainB > "$OUT/peers_chainB.txt"
python3 bench/fusion_summary.py "$OUT" | tee "$OUT/summary.md"
