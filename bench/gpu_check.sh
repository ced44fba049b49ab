#!/usr/bin/env bash
# Everything the CUDA backend needs a GPU for, in one run (meant for one call on a lent GPU
# machine): build, the runtime tests, every exported model on the GPU against the CPU, and the
# LLaMA-7B block at decode (seq 1) and prefill (seq 512), unfused / fused / fused + CUDA graph,
# beside PyTorch eager and torch.compile on the same shapes (f32 and bf16).
#
#   bench/gpu_check.sh [OUT_DIR]      # default bench/results/gpu: summary.txt and raw.tar.gz
#   GF_GPU_PART=1|2|quick|all GF_GPU_BUDGET=SECONDS bench/gpu_check.sh OUT_DIR   # a part, a time budget
#
# Each step is time-boxed and its failure is reported without stopping the others, so that one
# run brings back as much as it can. The GPU machine's image has CUDA, CMake and PyTorch but not
# this project's Debian libraries, and nothing can be installed there: make gpu_bundle.tar.xz here
# (bench/gpu_bundle.sh) and carry it; without it the script tries to build in ./build.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu}
mkdir -p "$OUT"
# Two files come back: OUT/summary.txt (every step's exit status and output tail) and
# OUT/raw.tar.gz (every step's whole output and JSON), packed as each step ends.
RAW=$(mktemp -d)
log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }
# One device command may run 10 minutes: every step shares one budget (GF_GPU_BUDGET seconds,
# default 540), the most important first; a step gets at most what is left.
DEADLINE=$((SECONDS + ${GF_GPU_BUDGET:-540}))
step() {  # step NAME SECONDS CMD... : runs CMD with a time limit, output to RAW/NAME.txt
  local name=$1 secs=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then log "$name: skipped (out of time)"; return 124; fi
  [ "$secs" -gt "$left" ] && secs=$left
  local t0=$SECONDS
  timeout "$secs" "$@" > "$RAW/$name.txt" 2>&1
  local rc=$?
  log "$name: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$RAW/$name.txt" >> "$OUT/summary.txt"
  tar -C "$RAW" -czf "$OUT/raw.tar.gz" .
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
  # CUDA's own libraries come from the machine: where a soname is not found on the path, look
  # for it in the toolkit's and the Python packages' folders.
  for lib in $(ldd "$GF" "$TESTS" | awk '/not found/ {print $1}' | sort -u); do
    hit=$(find /usr/local /usr/lib /opt -name "$lib" 2> /dev/null | head -1)
    if [ -n "$hit" ]; then export LD_LIBRARY_PATH=$(dirname "$hit"):$LD_LIBRARY_PATH; log "found $hit"; else log "missing: $lib"; fi
  done
elif [ ! -x build/graphfuse ] || [ ! -x build/tests/graphfuse_cuda_tests ]; then
  step configure 300 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release || { log "configure failed"; exit 1; }
  step build 900 cmake --build build -j "$(nproc)" --target graphfuse_cli graphfuse_cuda_tests || { log "build failed"; exit 1; }
fi
step versions 30 sh -c "$GF --help | head -3; ldd $GF | grep -E 'not found|cuda|cublas|nvrtc'"

export GF_KERNEL_CACHE=/tmp/graphfuse_kernels  # NVRTC disk cache shared by every step
# The first Python that has PyTorch (`python3` on PATH may be a pyenv or venv shim without it).
PY=python3
for p in python3 /usr/bin/python3 /usr/local/bin/python3 python; do
  if command -v "$p" > /dev/null && "$p" -c "import torch" 2> /dev/null; then PY=$p; break; fi
done
log "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1))"

# GF_GPU_PART picks the steps: 1 (what "done" asks for, the runtime tests, prefill), 2 (the
# rest: bf16 and prefill peers, the other presets, every exported model), all (default: 1 then
# 2), or quick (a re-check after a change, about 2 minutes: the done-when figures, prefill,
# torch.compile at both sizes, the runtime tests).
PART=${GF_GPU_PART:-all}
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }

# The steps parts share. bench_preset P: P at 64 Mi elements beside a same-run device copy.
# demo_block SEQ REPEATS: the LLaMA-7B block, unfused / fused / fused + CUDA graph, against the
# CPU, every step's device time. torch_block NAME SECONDS ARGS...: PyTorch on the same block.
bench_preset() {
  step "bench_$1_64Mi" 90 $GF bench --preset "$1" --elements 67108864 --repeats 21 --backend cuda \
    --json "$RAW/bench_$1_64Mi.json"
}
demo_block() {
  step "demo_llama7b_seq$1" 150 $GF demo --preset llama7b --seq "$1" --threads "$(nproc)" --repeats "$2" \
    --backend cuda --profile --json "$RAW/demo_llama7b_seq$1.json"
}
torch_block() {
  local name=$1 secs=$2
  shift 2
  step "$name" "$secs" "$PY" bench/peers/block_torch.py --preset llama7b --device cuda --repeats 51 "$@"
}
runtime_tests() { step cuda_runtime_tests 150 "$TESTS" --gtest_filter='CudaRuntime.*'; }

if part quick; then
  bench_preset chain
  for seq in 1 512; do
    demo_block $seq 21
    torch_block "torch_compile_seq${seq}_f32" 120 --seq $seq --compile
  done
  runtime_tests
fi

# The test blocks computed in bf16 and f16 on the GPU (`run --dtype`), against the CPU's f32
# plan within the dtype's tolerance: the narrow kernels and GEMMs on a device for the first time.
narrow_runs() {
  for m in llama_block_opset17 gpt2_block_opset17 bert_layer_opset17 mlp_gelu_opset17; do
    for dt in bf16 f16; do
      step "run_${m}_$dt" 30 $GF run "tests/models/$m/model.onnx" --data "tests/models/$m/test_data_set_0" --backend cuda \
        --dtype $dt
    done
  done
}

if part quick; then
  narrow_runs
fi

if part 1; then
  # What "done" asks for first: fused elementwise against a same-run device copy at 64 Mi; the
  # LLaMA-7B decode block; PyTorch eager and torch.compile on the same block. Then the runtime
  # tests (demo presets and exported models, unfused / fused, stream / CUDA graph, against the
  # CPU; the codegen and NVRTC tests run in CI, and in part 2 here), and prefill.
  bench_preset chain
  demo_block 1 21
  torch_block torch_eager_seq1_f32 60 --seq 1
  torch_block torch_compile_seq1_f32 120 --seq 1 --compile
  runtime_tests
  demo_block 512 11
  torch_block torch_compile_ro_seq1_f32 120 --seq 1 --compile --mode reduce-overhead
  narrow_runs
fi

if part 2; then
  step cuda_tests 200 "$TESTS" --gtest_filter='-CudaRuntime.*'
  # Prefill, and bf16 for PyTorch (graphfuse's demo block is f32; `run --dtype` covers bf16).
  for seq in 1 512; do
    for dt in f32 bf16; do
      [ "$seq$dt" = "1f32" ] && continue
      torch_block "torch_eager_seq${seq}_$dt" 60 --seq $seq --dtype $dt
      torch_block "torch_compile_seq${seq}_$dt" 120 --seq $seq --dtype $dt --compile
    done
  done
  # The other elementwise presets, and every exported model with its reference outputs on the
  # GPU (launched, and as a CUDA graph).
  for preset in gelu silu residual; do bench_preset $preset; done
  for m in tests/models/*/; do
    name=$(basename "$m")
    step "run_$name" 30 $GF run "$m/model.onnx" --data "$m/test_data_set_0" --backend cuda
    step "run_${name}_graph" 30 $GF run "$m/model.onnx" --data "$m/test_data_set_0" --backend cuda --cuda-graph
  done
fi
log "done; every output in $OUT/raw.tar.gz"
