#!/usr/bin/env bash
# Everything the CUDA backend needs a GPU for, in one run (meant for one call on a lent GPU
# machine): build, the runtime tests, every exported model on the GPU against the CPU in f32,
# bf16 and f16, and the LLaMA-7B block at decode (seq 1 over a KV cache of 2048 rows, one
# FusedCachedAttention in the fused plan) in f32, bf16 and f16 and at prefill (seq 512) in bf16
# and f16, unfused / fused / fused + CUDA graph, beside PyTorch eager and torch.compile (default,
# reduce-overhead, max-autotune) on the same shapes and cache, and the device memory the demo's
# plans hold against their buffers without reuse.
#
#   bench/gpu_check.sh [OUT_DIR]      # default bench/results/gpu: summary.txt and raw.tar.gz
#   GF_GPU_PART=1|2|quick|all GF_GPU_BUDGET=SECONDS bench/gpu_check.sh OUT_DIR   # a part, a time budget
#
# Parts (each a separate device command; the budgets are the defaults of GF_GPU_BUDGET, and
# each step's own limit below keeps one slow step from taking a part's whole budget; the
# figures are planned, not yet measured on an H200):
#   quick  ~3 min: the chain preset in bf16 against a device copy, the five demo block runs
#          (decode f32 / bf16 / f16, prefill bf16 / f16, each with --profile and --json), their
#          device memory, torch.compile on the bf16 decode step and prefill, the runtime tests
#   1      ~5 min: the chain preset in f32 and bf16, the same demo runs with more repeats,
#          device memory, PyTorch eager and
#          torch.compile (default, reduce-overhead, max-autotune) on the decode step, the
#          runtime tests, prefill peers, the test blocks in bf16 / f16
#   2      ~5 min: every tests/models model (tests/models/hf too) on the GPU in f32 (also as a
#          CUDA graph), bf16 and f16 against the CPU's f32 plan and the reference outputs, the
#          other CUDA tests, f16 and max-autotune prefill peers, the other elementwise presets
#   all    1 then 2 (~10 min: one device command's limit)
# The ONNX node tests (build/tests/onnx_node_tests) run on the CPU only and need Debian's
# libonnx-testdata, which the GPU image lacks: part 2 runs the model corpus instead.
#
# Each step is time-boxed and its failure is reported without stopping the others, so that one
# run brings back as much as it can. The GPU machine's image has CUDA, CMake and PyTorch but not
# this project's Debian libraries, and nothing can be installed there: make gpu_bundle.tar.xz here
# (bench/gpu_bundle.sh) and carry it; without it the script tries to build in ./build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-bench/results/gpu}
mkdir -p "$OUT"
# Two files come back: OUT/summary.txt (every step's exit status and output tail) and
# OUT/raw.tar.gz (every step's whole output and JSON), packed as each step ends.
RAW=$(mktemp -d)
log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }
# One device command may run 10 minutes: every step shares one budget (GF_GPU_BUDGET seconds;
# default 180 for quick, 300 for part 1 or 2, 540 for all), the most important first; a step
# gets at most what is left.
PART=${GF_GPU_PART:-all}
case "$PART" in quick) BUDGET=180 ;; 1 | 2) BUDGET=300 ;; *) BUDGET=540 ;; esac
DEADLINE=$((SECONDS + ${GF_GPU_BUDGET:-$BUDGET}))
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
    if [ -n "$hit" ]; then LD_LIBRARY_PATH=$(dirname "$hit"):$LD_LIBRARY_PATH; export LD_LIBRARY_PATH; log "found $hit"; else log "missing: $lib"; fi
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

# GF_GPU_PART picks the steps (see the header): quick, 1, 2 or all (1 then 2).
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }

# The steps parts share. bench_preset P [DT]: P at 64 Mi elements (f32, or DT) beside a
# same-run device copy.
bench_preset() {
  local dt=${2:-f32}
  step "bench_$1_64Mi_$dt" 90 $GF bench --preset "$1" --elements 67108864 --repeats 21 --backend cuda --dtype "$dt" \
    --json "$RAW/bench_$1_64Mi_$dt.json"
}
# demo_block NAME SECONDS FLAGS...: the LLaMA-7B block on the GPU (unfused / fused / fused + CUDA
# graph, against the CPU's f32 plan, every step's device time), its JSON in RAW/NAME.json.
demo_block() {
  local name=$1 secs=$2
  shift 2
  step "$name" "$secs" $GF demo --preset llama7b --threads "$(nproc)" --backend cuda --profile \
    --json "$RAW/$name.json" "$@"
}
# The decode step (seq 1 over a KV cache of 2048 rows) in f32, bf16, f16, and prefill (seq 512)
# in bf16 and f16; then the device memory of their plans (bench/gpu_memory_check.py).
DECODE=(--seq 1 --past 2048)
demo_blocks() {  # demo_blocks DECODE_REPEATS PREFILL_REPEATS
  for dt in f32 bf16 f16; do demo_block "demo_llama7b_decode2048_$dt" 75 "${DECODE[@]}" --dtype $dt --repeats "$1"; done
  for dt in bf16 f16; do demo_block "demo_llama7b_prefill512_$dt" 90 --seq 512 --dtype $dt --repeats "$2"; done
  step device_memory 20 "$PY" bench/gpu_memory_check.py "$RAW"/demo_llama7b_*.json
}
# torch_block NAME SECONDS ARGS...: PyTorch on the same block (bench/peers/block_torch.py).
torch_block() {
  local name=$1 secs=$2
  shift 2
  step "$name" "$secs" "$PY" bench/peers/block_torch.py --preset llama7b --device cuda --repeats 51 "$@"
}
runtime_tests() { step cuda_runtime_tests 150 "$TESTS" --gtest_filter='CudaRuntime.*'; }

if part quick; then
  bench_preset chain bf16
  demo_blocks 11 5
  torch_block torch_compile_decode2048_bf16 120 "${DECODE[@]}" --dtype bf16 --compile
  torch_block torch_compile_prefill512_bf16 90 --seq 512 --dtype bf16 --compile
  runtime_tests
fi

# The test blocks computed in bf16 and f16 on the GPU (`run --dtype`), against the CPU's f32
# plan within the dtype's tolerance.
narrow_runs() {
  for m in llama_block_opset17 gpt2_block_opset17 bert_layer_opset17 mlp_gelu_opset17; do
    for dt in bf16 f16; do
      step "run_${m}_$dt" 30 $GF run "tests/models/$m/model.onnx" --data "tests/models/$m/test_data_set_0" --backend cuda \
        --dtype $dt
    done
  done
}

if part 1; then
  # What "done" asks for first: fused elementwise against a same-run device copy at 64 Mi; the
  # LLaMA-7B decode step and prefill in every dtype and their memory; PyTorch eager and
  # torch.compile on the same decode step. Then the runtime tests (demo presets and exported
  # models, unfused / fused, stream / CUDA graph, against the CPU; the codegen and NVRTC tests
  # run in CI, and in part 2 here), the slow max-autotune compile, the prefill peers.
  bench_preset chain
  bench_preset chain bf16
  demo_blocks 21 11
  for dt in f32 bf16 f16; do torch_block "torch_eager_decode2048_$dt" 45 "${DECODE[@]}" --dtype $dt; done
  torch_block torch_compile_decode2048_f32 120 "${DECODE[@]}" --compile
  torch_block torch_compile_decode2048_bf16 120 "${DECODE[@]}" --dtype bf16 --compile
  torch_block torch_compile_ro_decode2048_bf16 120 "${DECODE[@]}" --dtype bf16 --compile --mode reduce-overhead
  runtime_tests
  torch_block torch_compile_ma_decode2048_bf16 180 "${DECODE[@]}" --dtype bf16 --compile --mode max-autotune
  torch_block torch_eager_prefill512_bf16 45 --seq 512 --dtype bf16
  torch_block torch_compile_prefill512_bf16 120 --seq 512 --dtype bf16 --compile
  narrow_runs
fi

# corpus DT: every tests/models model (tests/models/hf too) with its first data set on the GPU
# in DT (f32: also replayed as one CUDA graph), 4 at a time, each model limited to 60 s; one
# line per model ("ok" or the exit status and its last lines), then the counts. `run` compares
# the GPU's outputs with the CPU's f32 plan and with the reference outputs (within the dtype's
# tolerance in bf16 / f16).
corpus_one() {  # corpus_one MODEL_DIR DT EXTRA_FLAG
  local m=${1%/} dt=$2 extra=${3:-}
  local name
  name=$(echo "${m#tests/models/}" | tr / _)$( [ -n "$extra" ] && echo _graph)
  timeout 60 "$GF" run "$m/model.onnx" --data "$m/test_data_set_0" --backend cuda --dtype "$dt" ${extra:+"$extra"} \
    > "$RAW/corpus_$dt/$name.txt" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "ok    $name"; else echo "exit $rc $name: $(tail -n 3 "$RAW/corpus_$dt/$name.txt" | tr '\n' ' ')"; fi
}
corpus() {
  local dt=$1
  mkdir -p "$RAW/corpus_$dt"
  {
    for m in tests/models/*/ tests/models/hf/*/; do
      [ -f "$m/model.onnx" ] || continue
      echo "$m $dt"
      [ "$dt" = f32 ] && echo "$m $dt --cuda-graph"
    done
  } | xargs -P 4 -L 1 bash -c 'corpus_one "$@"' _ | tee "$RAW/corpus_$dt.list"
  echo "corpus $dt: $(grep -c '^ok' "$RAW/corpus_$dt.list") ok, $(grep -vc '^ok' "$RAW/corpus_$dt.list") not"
  ! grep -vq '^ok' "$RAW/corpus_$dt.list"
}
export -f corpus_one corpus
export GF RAW

if part 2; then
  for dt in f32 bf16 f16; do step "corpus_$dt" 90 bash -c "corpus $dt"; done
  step cuda_tests 120 "$TESTS" --gtest_filter='-CudaRuntime.*'
  torch_block torch_eager_decode2048_f16 45 "${DECODE[@]}" --dtype f16
  torch_block torch_compile_decode2048_f16 120 "${DECODE[@]}" --dtype f16 --compile
  torch_block torch_compile_prefill512_f16 120 --seq 512 --dtype f16 --compile
  torch_block torch_compile_ma_prefill512_bf16 150 --seq 512 --dtype bf16 --compile --mode max-autotune
  for preset in gelu silu residual; do bench_preset $preset; done
fi
log "done; every output in $OUT/raw.tar.gz"
