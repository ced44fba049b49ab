#!/usr/bin/env bash
# Everything the CUDA backend needs a GPU for, in one run (meant for one call on a lent GPU
# machine): build, the runtime tests, every exported model on the GPU against the CPU, and the
# LLaMA-7B block at decode (seq 1) and prefill (seq 512), unfused / fused / fused + CUDA graph,
# beside PyTorch eager and torch.compile on the same shapes (f32 and bf16).
#
#   bench/gpu_check.sh [OUT_DIR]      # default bench/results/gpu; prints a summary at the end
#
# Each step is time-boxed and its failure is reported without stopping the others, so that one
# run brings back as much as it can. The GPU machine's image has CUDA, CMake and PyTorch but not
# this project's Debian libraries, and nothing can be installed there: make gpu_bundle.tar.xz here
# (bench/gpu_bundle.sh) and carry it; without it the script tries to build in ./build.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu}
mkdir -p "$OUT"
log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }
step() {  # step NAME SECONDS CMD... : runs CMD with a time limit, output to OUT/NAME.txt
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  log "$name: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$OUT/$name.txt" >> "$OUT/summary.txt"
  return $rc
}
: > "$OUT/summary.txt"
log "machine: $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
log "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

GF=./build/graphfuse
TESTS=./build/tests/graphfuse_cuda_tests
if [ -f gpu_bundle.tar.xz ]; then
  # Built elsewhere (bench/gpu_bundle.sh): its binaries, its libraries, and its source path
  # (where the tests look for tests/models and tests/golden) pointing here.
  rm -rf /tmp/gpu_bundle && tar -C /tmp -xJf gpu_bundle.tar.xz
  src=$(cat /tmp/gpu_bundle/source_dir)
  if [ "$src" != "$(pwd)" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$(pwd)" "$src"; fi
  export LD_LIBRARY_PATH=/tmp/gpu_bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  GF=/tmp/gpu_bundle/bin/graphfuse
  TESTS=/tmp/gpu_bundle/bin/graphfuse_cuda_tests
  log "using gpu_bundle.tar.xz: $(head -1 /tmp/gpu_bundle/README)"
elif [ ! -x build/graphfuse ] || [ ! -x build/tests/graphfuse_cuda_tests ]; then
  step configure 300 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release || { log "configure failed"; exit 1; }
  step build 900 cmake --build build -j "$(nproc)" --target graphfuse_cli graphfuse_cuda_tests || { log "build failed"; exit 1; }
fi
step versions 30 sh -c "$GF --help | head -3; ldd $GF | grep -E 'not found|cuda|cublas|nvrtc'"

# 1. Runtime tests: the corpus (demo presets, exported models) unfused / fused, stream / CUDA
#    graph, against the CPU; plus codegen and NVRTC for the device.
step cuda_tests 600 "$TESTS"

# 2. Exported models with their float64-derived references, on the GPU (and as a CUDA graph).
for m in tests/models/*/; do
  name=$(basename "$m")
  step "run_$name" 120 $GF run "$m/model.onnx" --data "$m/test_data_set_0" --backend cuda
  step "run_${name}_graph" 120 $GF run "$m/model.onnx" --data "$m/test_data_set_0" --backend cuda --cuda-graph
done

# 3. Fused elementwise chains on the GPU beside a same-run device-to-device copy (64 Mi f32).
for preset in chain gelu silu residual; do
  step "bench_${preset}_64Mi" 300 $GF bench --preset $preset --elements 67108864 --repeats 21 --backend cuda \
    --json "$OUT/bench_${preset}_64Mi.json"
done

# 4. The LLaMA-7B block: decode and prefill; graphfuse (f32) and PyTorch (f32, bf16; eager and
#    torch.compile), same shapes.
for seq in 1 512; do
  step "demo_llama7b_seq$seq" 900 $GF demo --preset llama7b --seq $seq --threads "$(nproc)" --repeats 21 \
    --backend cuda --json "$OUT/demo_llama7b_seq$seq.json"
  for dt in f32 bf16; do
    step "torch_eager_seq${seq}_$dt" 300 python3 bench/peers/block_torch.py --preset llama7b --seq $seq \
      --device cuda --dtype $dt --repeats 51
    step "torch_compile_seq${seq}_$dt" 600 python3 bench/peers/block_torch.py --preset llama7b --seq $seq \
      --device cuda --dtype $dt --repeats 51 --compile
  done
done
log "done; raw outputs in $OUT"
