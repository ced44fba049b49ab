#!/usr/bin/env bash
# The command-line contract (docs/ARCHITECTURE.md): exit 0 ok, 2 bad usage with a message, --help truthful.
set -u
GF="$1"
fail=0
check() {  # check NAME WANT_EXIT CMD...
  local name=$1 want=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then echo "FAIL $name: exit $rc, want $want"; echo "$out" | head -20; fail=1; return; fi
  echo "ok   $name"
  LAST="$out"
}
check help 0 "$GF" --help
echo "$LAST" | grep -q "demo" || { echo "FAIL help does not mention demo"; fail=1; }
check no-args 2 "$GF"
# COMMAND --help: that command's part of the text, exit 0, nothing run.
for c in demo run explain bench ops; do
  check "help-$c" 0 "$GF" "$c" --help
  echo "$LAST" | grep -q "^  $c " || { echo "FAIL $c --help does not show the $c section"; fail=1; }
  echo "$LAST" | grep -q "^  help " && { echo "FAIL $c --help prints the whole text"; fail=1; }
done
check help-after-flags 0 "$GF" bench --preset chain -h
check unknown-command 2 "$GF" frobnicate
echo "$LAST" | grep -q "frobnicate" || { echo "FAIL unknown command not named"; fail=1; }
check ops 0 "$GF" ops
echo "$LAST" | grep -q "Gelu" || { echo "FAIL ops does not list Gelu"; fail=1; }
check demo-bad-flag 2 "$GF" demo --preset elementwise --elements
check demo-bad-number 2 "$GF" demo --preset elementwise --elements abc
check demo-absurd 2 "$GF" demo --preset elementwise --elements 99999999999999
check demo-unknown-preset 2 "$GF" demo --preset llama99
echo "$LAST" | grep -q "llama-small" || { echo "FAIL unknown preset error does not list the presets"; fail=1; }
check demo-bad-seq 2 "$GF" demo --seq 0
# An output file that cannot be written is refused before any work (no weights generated).
check demo-json-no-dir 2 "$GF" demo --preset llama-small --json /nonexistent_dir/out.json
echo "$LAST" | grep -q "/nonexistent_dir' does not exist" || { echo "FAIL demo --json names no missing directory"; fail=1; }
echo "$LAST" | grep -q "generating" && { echo "FAIL demo --json error came after the work"; fail=1; }
check demo-json-is-dir 2 "$GF" demo --preset elementwise --json /tmp
echo "$LAST" | grep -q "is a directory" || { echo "FAIL demo --json on a directory"; fail=1; }
check bench-json-no-dir 2 "$GF" bench --preset chain --json /nonexistent_dir/b.json
# Usage errors name the command once: "graphfuse run: --rtol ...", not "graphfuse run: run: ...".
for c in "run --rtol" "bench --repeats" "explain --max-group-size"; do
  check "${c% *}-bad-number" 2 "$GF" ${c% *} "$(dirname "$0")/models/mlp_gelu_opset17/model.onnx" ${c#* } abc
  echo "$LAST" | grep -q "^graphfuse ${c% *}: ${c#* } " || { echo "FAIL ${c% *} usage error: $LAST"; fail=1; }
done
check explain-dot-no-dir 2 "$GF" explain "$(dirname "$0")/models/mlp_gelu_opset17/model.onnx" --dot /nonexistent_dir/p.dot
check demo-block 0 "$GF" demo --preset llama-small --seq 16 --repeats 3 --json /tmp/graphfuse_block.json
python3 -c "
import json; j=json.load(open('/tmp/graphfuse_block.json'))
assert j['kernels_fused'] <= 8 < j['kernels_unfused'], j
assert all(o['ok'] for o in j['outputs']), j['outputs']
assert j['outside_gemm_ms']['fused'] > 0 and j['latency_ms']['unfused'] > 0, j
rr = j['outside_gemm_round_ratio']
assert rr['rounds'] >= 3 and 0 < rr['min'] <= rr['median'] <= rr['max'], rr
assert {g['kind'] for g in j['groups']} >= {'attention', 'gemm_epilogue'}, j['groups']
att = [g for g in j['groups'] if g['kind'] == 'attention']
assert len(att) == 1 and '/q_proj/MatMul' in att[0]['nodes'], j['groups']  # the QKV GEMM inside
" || { echo "FAIL demo --json: kernel counts, check, times or group kinds"; fail=1; }
# On an empty GEMM cache the first plan times its shape classes, and says so on stderr as it starts
# each (seconds on large weights); a second run finds them cached and times nothing.
rm -rf /tmp/graphfuse_cli_gemm_cache
check demo-gemm-timing 0 env GF_KERNEL_CACHE=/tmp/graphfuse_cli_gemm_cache "$GF" demo --preset llama-small --seq 16 --repeats 3
echo "$LAST" | grep -q "^graphfuse: timing the CPU's GEMM engines for 512x512 f32 weights at 16 rows on" \
  || { echo "FAIL demo on an empty GEMM cache does not tell of its timing: $LAST"; fail=1; }
check demo-gemm-cached 0 env GF_KERNEL_CACHE=/tmp/graphfuse_cli_gemm_cache "$GF" demo --preset llama-small --seq 16 --repeats 3
echo "$LAST" | grep -q "timing the CPU's GEMM engines" && { echo "FAIL demo timed its GEMMs again: $LAST"; fail=1; }
check demo-small 0 "$GF" demo --preset elementwise --elements 4096 --repeats 5 --json /tmp/graphfuse_cli_test.json
grep -q '"ops"' /tmp/graphfuse_cli_test.json || { echo "FAIL demo json lacks ops"; fail=1; }
python3 -c "import json,sys; json.load(open('/tmp/graphfuse_cli_test.json'))" || { echo "FAIL demo json invalid"; fail=1; }
check run-missing-model 2 "$GF" run /nonexistent/missing.onnx
echo "$LAST" | grep -q "missing.onnx" || { echo "FAIL run error does not name the file"; fail=1; }
head -c 1000 /dev/urandom > /tmp/graphfuse_garbage.onnx
check run-garbage 2 "$GF" run /tmp/graphfuse_garbage.onnx
MODELS="$(dirname "$0")/models"
head -c 3000 "$MODELS/mlp_gelu_opset17/model.onnx" > /tmp/graphfuse_truncated.onnx
# Reference data that is empty, or that parses as a TensorProto with no element type.
rm -rf /tmp/graphfuse_bad_data && cp -r "$MODELS/mlp_gelu_opset17/test_data_set_0" /tmp/graphfuse_bad_data
: > /tmp/graphfuse_bad_data/output_0.pb
check run-empty-reference 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data /tmp/graphfuse_bad_data
echo "$LAST" | grep -q "output_0.pb: the file is empty" || { echo "FAIL empty reference: $LAST"; fail=1; }
printf '\x08\x01' > /tmp/graphfuse_bad_data/output_0.pb  # field 1 (dims) = 1: no data_type
check run-typeless-reference 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data /tmp/graphfuse_bad_data
echo "$LAST" | grep -q "output_0.pb: holds no tensor" || { echo "FAIL typeless reference: $LAST"; fail=1; }
check run-truncated 2 "$GF" run /tmp/graphfuse_truncated.onnx
echo "$LAST" | grep -q "graphfuse_truncated.onnx" || { echo "FAIL truncated model error does not name the file"; fail=1; }
check run-model 0 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data "$MODELS/mlp_gelu_opset17/test_data_set_0" \
  --check-fusion --json /tmp/graphfuse_run.json
python3 -c "import json; j=json.load(open('/tmp/graphfuse_run.json')); assert j['kernels_fused'] < j['kernels_unfused'], j; assert all(o['ok'] for o in j['outputs'])" \
  || { echo "FAIL run --json lacks fused kernel counts or ok outputs"; fail=1; }
# --trace: Chrome-trace JSON of the run; one event per kernel of the plan (as many as the run
# event's "kernels"), the fused ones named as the --json report names them, with their members.
check run-trace 0 "$GF" run "$MODELS/llama_block_opset17/model.onnx" --data "$MODELS/llama_block_opset17/test_data_set_0" \
  --json /tmp/graphfuse_trace_report.json --trace /tmp/graphfuse_trace.json
python3 -c "
import json
t = json.load(open('/tmp/graphfuse_trace.json')); r = json.load(open('/tmp/graphfuse_trace_report.json'))
ev = [e for e in t['traceEvents'] if e['ph'] == 'X']
runs = [e for e in ev if e['cat'] == 'run']; kernels = [e for e in ev if e['cat'] not in ('run', 'planning')]
assert len(runs) == 1 and len(kernels) == runs[0]['args']['kernels'] == r['kernels_fused'], (len(kernels), runs)
by_name = {k['name']: k for k in kernels}
for g in r['groups']:
    assert by_name[g['name']]['args']['members'] == g['nodes'], g['name']
assert all(k['dur'] >= 0 and runs[0]['ts'] <= k['ts'] for k in kernels)
" || { echo "FAIL run --trace does not hold the plan's kernels"; fail=1; }
check run-trace-no-dir 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --trace /nonexistent_dir/t.json
echo "$LAST" | grep -q "/nonexistent_dir' does not exist" || { echo "FAIL run --trace names no missing directory"; fail=1; }
check bench-trace 0 "$GF" bench --preset chain --elements 4096 --repeats 3 --trace /tmp/graphfuse_bench_trace.json
python3 -c "
import json; t = json.load(open('/tmp/graphfuse_bench_trace.json'))
runs = [e['args']['signature'] for e in t['traceEvents'] if e['ph'] == 'X' and e['cat'] == 'run']
assert runs == ['cpu plan, unfused'] * 3 + ['cpu plan, fused'] * 3, runs
" || { echo "FAIL bench --trace does not hold three runs of each plan"; fail=1; }
# Weights in an external data file (the dynamo exporter's model.onnx.data): read from the model's
# folder; a location that leaves it is refused with exit 2, naming the initializer and location.
check run-external-data 0 "$GF" run "$MODELS/external_data_opset17/model.onnx" \
  --data "$MODELS/external_data_opset17/test_data_set_0" --check-fusion
check run-external-data-outside 2 "$GF" run "$MODELS/external_data_opset17/outside/model.onnx"
echo "$LAST" | grep -q "initializer 'W'.*'../model.onnx.data' leaves the model's folder" \
  || { echo "FAIL external data outside the folder: $LAST"; fail=1; }
# bench --generate: a serving loop over a decoder exported with a KV cache (the dynamo export of a
# small LLaMA in the corpus), in f32 and with --dtype bf16 (the GEMM weights held in bf16, so the
# weights its plans share are fewer bytes); repeats give the same tokens (else exit 1).
KV="$MODELS/hf/llama_sdpa_dynamo_kv/model.onnx"
check bench-generate 0 "$GF" bench "$KV" --generate 8:4 --repeats 2 --threads 2 --json /tmp/graphfuse_gen_f32.json
echo "$LAST" | grep -q "2 thread(s), f32;" && echo "$LAST" | grep -q "the same tokens in every generation" \
  || { echo "FAIL bench --generate: $LAST"; fail=1; }
check bench-generate-bf16 0 "$GF" bench "$KV" --generate 8:4 --repeats 2 --threads 2 --dtype bf16 \
  --json /tmp/graphfuse_gen_bf16.json
echo "$LAST" | grep -q "GEMM weights in bf16" || { echo "FAIL bench --generate --dtype bf16: $LAST"; fail=1; }
python3 -c "
import json
f, b = (json.load(open('/tmp/graphfuse_gen_%s.json' % d)) for d in ('f32', 'bf16'))
assert (f['dtype'], b['dtype']) == ('f32', 'bf16'), (f['dtype'], b['dtype'])
assert len(f['tokens']) == len(b['tokens']) == 4, (f['tokens'], b['tokens'])
assert 0 < b['prepared_bytes'] < f['prepared_bytes'], (b['prepared_bytes'], f['prepared_bytes'])
" || { echo "FAIL bench --generate --json: dtype, tokens or the bf16 weights' bytes"; fail=1; }
check bench-generate-f16 2 "$GF" bench "$KV" --generate 8:4 --dtype f16
echo "$LAST" | grep -q "f16 needs the cuda target" || { echo "FAIL bench --generate --dtype f16: $LAST"; fail=1; }
check bench-generate-bad-spec 2 "$GF" bench "$KV" --generate 8
check bench-generate-preset 2 "$GF" bench --preset llama-small --generate 8:4
check run-llama-check-fusion 0 "$GF" run "$MODELS/llama_block_opset17/model.onnx" --data "$MODELS/llama_block_opset17/test_data_set_0" \
  --check-fusion --json /tmp/graphfuse_llama.json
echo "$LAST" | grep -q "all agree" || { echo "FAIL check-fusion on the llama block does not say all agree"; fail=1; }
python3 -c "
import json; j=json.load(open('/tmp/graphfuse_llama.json'))
kinds = sorted(g['kind'] for g in j['groups'])
assert kinds == ['attention', 'gemm_epilogue', 'gemm_epilogue', 'gemm_epilogue'], kinds
assert j['kernels_fused'] == 4 and all(o['ok'] for o in j['outputs']), j
# both RMSNorms folded (FoldNormIntoGemm): the post-attention one into the GEMMs around it,
# the input one into the projected attention
folded = [g for g in j['groups'] if '/post_norm/RMSNorm' in g['nodes']]
assert len(folded) == 1 and 'folded RMSNorm' in folded[0]['epilogue'] and 'Silu' in folded[0]['epilogue'], folded
att = [g for g in j['groups'] if g['kind'] == 'attention']
assert len(att) == 1 and att[0]['nodes'][0] == '/input_norm/RMSNorm', att
" || { echo "FAIL run --json on the llama block: group kinds, kernel count or outputs"; fail=1; }
check run-mismatch 1 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data "$MODELS/mlp_gelu_opset17/test_data_set_0" --rtol 0 --atol 0
check explain 0 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --dot /tmp/graphfuse_plan.dot --json /tmp/graphfuse_plan.json
grep -q "subgraph cluster_" /tmp/graphfuse_plan.dot || { echo "FAIL explain --dot has no group clusters"; fail=1; }
python3 -c "import json; j=json.load(open('/tmp/graphfuse_plan.json')); assert j['groups'] and j['refusals'], j" \
  || { echo "FAIL explain --json lacks groups or refusals"; fail=1; }
# Which engine runs each GEMM on the CPU, and why: the test block's 16 rows take the own f32
# tiles; with --dtype bf16 (f32 with bf16 weights, as `run` on the CPU) the engine the CPU's bf16
# instructions decide (the own dot products, oneDNN's bf16 matmul, or the own tiles widening).
echo "$LAST" | grep -q "how the CPU runs the GEMMs" && echo "$LAST" | grep -q "fused_gemm_.*16x64 @ 64x64 (f32 weights, packed once): own tiles" \
  || { echo "FAIL explain does not name the GEMM engines: $LAST"; fail=1; }
python3 -c "
import json; j=json.load(open('/tmp/graphfuse_plan.json'))
ops = sorted({g['op'] for g in j['kernel_choices']})
assert ops == ['FusedAttention', 'FusedGemm'] and all('own tiles' in g['how'] for g in j['kernel_choices']), j['kernel_choices']
" || { echo "FAIL explain --json lacks the CPU GEMM engines"; fail=1; }
# The pass manager's side: each pass that ran in the JSON with its changes and time, in pipeline
# order as --passes lists them; the IR printed after the pass named; an unknown pass refused.
python3 -c "
import json; j=json.load(open('/tmp/graphfuse_plan.json'))
names = [p['name'] for p in j['passes']]
assert names[0] == 'FoldConstants' and 'FuseGemm' in names and all(p['ms'] >= 0 and p['changes'] >= 0 for p in j['passes']), j['passes']
assert sum(p['changes'] for p in j['passes'] if p['name'] == 'FuseAttention') == 1, j['passes']
" || { echo "FAIL explain --json lacks the passes"; fail=1; }
check explain-passes 0 "$GF" explain --passes
echo "$LAST" | grep -q "^  FuseAttentionProjections *fusion" || { echo "FAIL explain --passes: $LAST"; fail=1; }
check explain-print-ir-after 0 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --print-ir-after=FuseAttention
[ "$(echo "$LAST" | grep -c '^// after ')" = 1 ] && echo "$LAST" | grep -q "^// after FuseAttention (1 changes)" \
  || { echo "FAIL explain --print-ir-after=FuseAttention"; fail=1; }
check explain-print-ir-unknown 2 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --print-ir-before FuseEverything
echo "$LAST" | grep -q "no pass named 'FuseEverything'" || { echo "FAIL unknown pass not named: $LAST"; fail=1; }
check explain-cpu-bf16 0 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --dtype bf16
echo "$LAST" | grep -q "computing in f32 with bf16 GEMM weights" \
  && echo "$LAST" | grep -Eq "\(bf16 weights, packed once\): (own bf16 dot-product tiles|oneDNN bf16 matmul|own tiles, bf16 weights widened)" \
  || { echo "FAIL explain --dtype bf16 on the CPU: $LAST"; fail=1; }
check explain-cpu-f16 2 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --dtype f16
echo "$LAST" | grep -q "add --cuda-src" || { echo "FAIL explain --dtype f16 on the CPU: $LAST"; fail=1; }
if "$GF" --help | grep -q -- "--cuda-src" && "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --cuda-src /tmp/graphfuse_cuda_src > /tmp/graphfuse_cuda_plan.txt 2>&1; then
  grep -q "generated attention kernel" /tmp/graphfuse_cuda_plan.txt && ls /tmp/graphfuse_cuda_src/attention_*.cu > /dev/null \
    && echo "ok   explain-cuda-src" || { echo "FAIL explain --cuda-src: no attention kernel or no sources"; fail=1; }
elif ! grep -q "no CUDA backend" /tmp/graphfuse_cuda_plan.txt; then
  echo "FAIL explain --cuda-src"; cat /tmp/graphfuse_cuda_plan.txt; fail=1
fi
check bench-preset 0 "$GF" bench --preset chain --elements 8192 --repeats 3 --json /tmp/graphfuse_bench.json
python3 -c "import json; j=json.load(open('/tmp/graphfuse_bench.json')); assert set(j['gbps']) == {'unfused','fused','triad'} and j['kernels_fused'] == 1, j" \
  || { echo "FAIL bench --json lacks gbps or kernel counts"; fail=1; }
# --cpu-codegen: a third row checked bit for bit against the tile executor (kernel cache of
# this test only), and a compiler that does not run named with exit 2.
rm -rf /tmp/graphfuse_cli_kernels
check bench-native 0 env GF_KERNEL_CACHE=/tmp/graphfuse_cli_kernels "$GF" bench --preset chain --elements 8192 --repeats 3 \
  --cpu-codegen --json /tmp/graphfuse_bench_native.json
echo "$LAST" | grep -q "== native (bitwise)" || { echo "FAIL bench --cpu-codegen did not check the native row"; fail=1; }
python3 -c "import json; j=json.load(open('/tmp/graphfuse_bench_native.json')); assert j['latency_ms']['native'] > 0, j" \
  || { echo "FAIL bench --cpu-codegen --json lacks the native latency"; fail=1; }
ls /tmp/graphfuse_cli_kernels/cpu/gf_cpu_add_mul_add_*.so > /dev/null 2>&1 || { echo "FAIL no cached kernel named for its ops"; fail=1; }
rm -rf /tmp/graphfuse_cli_kernels
check bench-native-no-compiler 2 env CXX=/nonexistent/gf-cxx "$GF" bench --preset chain --elements 8192 --cpu-codegen
echo "$LAST" | grep -q "/nonexistent/gf-cxx" || { echo "FAIL a missing compiler is not named"; fail=1; }
check bench-unknown-preset 2 "$GF" bench --preset nope
# bench checks fused against unfused as run checks (--rtol / --atol, run's defaults), prints
# the error, and times every model of the corpus.
for m in "$MODELS"/*/model.onnx; do
  name=$(basename "$(dirname "$m")")
  check "bench-$name" 0 "$GF" bench "$m" --repeats 3
  echo "$LAST" | grep -q "checks: fused vs unfused max |err| .*, max rel " || { echo "FAIL bench $name prints no error"; fail=1; }
  echo "$LAST" | grep -q "^  fused .* ms" || { echo "FAIL bench $name timed nothing"; fail=1; }
done
# Models written by tests/onnx/make_cli_models.py (Debian's python3-onnx; not the pyenv python).
CLI_MODELS=/tmp/graphfuse_cli_models
rm -rf "$CLI_MODELS"
if /usr/bin/python3 "$(dirname "$0")/onnx/make_cli_models.py" "$CLI_MODELS"; then
  # The graph on which elementwise fusion made a cycle: it runs fused, every group checked.
  check run-fusion-cycle 0 "$GF" run "$CLI_MODELS/fusion_cycle.onnx" --check-fusion --json /tmp/graphfuse_cycle.json
  echo "$LAST" | grep -q "all agree" || { echo "FAIL fusion_cycle: check-fusion does not agree"; fail=1; }
  python3 -c "import json; j=json.load(open('/tmp/graphfuse_cycle.json')); assert j['kernels_fused'] < j['kernels_unfused'] == 15, j" \
    || { echo "FAIL fusion_cycle: not fused"; fail=1; }
  # Fused GEMMs differ from the unfused plan by rounding (norm scale folded into the weights,
  # another summation order): within run's tolerance, timed, exit 0; beyond the bound bench
  # once hard-coded (1e-5 relative + 1e-6 absolute), which refused it with exit 1.
  check bench-norm-gemm 0 "$GF" bench "$CLI_MODELS/norm_gemm.onnx" --repeats 3 --json /tmp/graphfuse_bench_ng.json
  python3 -c "
import json; j=json.load(open('/tmp/graphfuse_bench_ng.json'))
c = j['check']
assert c['rtol'] == 1e-4 and c['atol'] == 1e-5 and c['outputs'][0]['ok'], c
assert c['outputs'][0]['max_abs_err'] > 1e-6 and j['latency_ms']['fused'] > 0, j
" || { echo "FAIL bench --json on norm_gemm: check or latency"; fail=1; }
  # Results that really disagree with the tolerance asked for: exit 1, each output's error named.
  check bench-mismatch 1 "$GF" bench "$CLI_MODELS/norm_gemm.onnx" --rtol 0 --atol 0
  echo "$LAST" | grep -q "y .*max |err| .*DIFFERS" || { echo "FAIL bench-mismatch names no output: $LAST"; fail=1; }
  # Symbolic dims: the data gives the shapes; --shape binds them for explain / bench / random runs.
  DYN="$CLI_MODELS/dynamic_mlp.onnx"
  check run-dynamic 0 "$GF" run "$DYN" --data "$CLI_MODELS/dynamic_mlp_data" --json /tmp/graphfuse_dyn.json
  echo "$LAST" | grep -q "planning: .* ms for f32\[2,3,8\];f32\[2,3\]" || { echo "FAIL run-dynamic: no planning time: $LAST"; fail=1; }
  python3 -c "
import json; j=json.load(open('/tmp/graphfuse_dyn.json'))
assert j['planning_ms'] > 0 and j['signature'] == 'f32[2,3,8];f32[2,3]' and j['kernels_fused'] == 1, j
assert all(o['ok'] for o in j['outputs']), j
" || { echo "FAIL run-dynamic --json: planning_ms, signature, kernels or outputs"; fail=1; }
  check explain-dynamic-unbound 2 "$GF" explain "$DYN"
  echo "$LAST" | grep -q "input 'x' f32\[batch,seq,8\] has symbolic dims: give 'batch', 'seq' with --shape" \
    || { echo "FAIL explain without --shape does not name the dims: $LAST"; fail=1; }
  check explain-dynamic 0 "$GF" explain "$DYN" --shape batch=4 --shape seq=16 --json /tmp/graphfuse_dyn_plan.json
  echo "$LAST" | grep -q "gemm_64x8x8" || { echo "FAIL explain --shape: the GEMM is not 64 rows: $LAST"; fail=1; }
  check bench-dynamic 0 "$GF" bench "$DYN" --shape x=2x32x8 --repeats 3 --json /tmp/graphfuse_dyn_bench.json
  python3 -c "import json; j=json.load(open('/tmp/graphfuse_dyn_bench.json')); assert j['planning_ms'] > 0, j" \
    || { echo "FAIL bench --shape --json lacks planning_ms"; fail=1; }
  check run-dynamic-random 0 "$GF" run "$DYN" --shape x=1x5x8
  check shape-disagree 2 "$GF" explain "$DYN" --shape x=2x5x8 --shape mask=3x5
  echo "$LAST" | grep -q "input 'mask': dim 0 ('batch') is 3 but input 'x' dim 0 gave 'batch' = 2" \
    || { echo "FAIL two inputs disagreeing on a symbolic dim: $LAST"; fail=1; }
  check shape-wrong-fixed 2 "$GF" explain "$DYN" --shape x=2x5x9 --shape mask=2x5
  echo "$LAST" | grep -q "input 'x': dim 2 is 9 but the model fixes it at 8" || { echo "FAIL wrong fixed dim: $LAST"; fail=1; }
  check shape-wrong-rank 2 "$GF" run "$DYN" --shape x=2x5 --shape mask=2x5
  echo "$LAST" | grep -q "input 'x' has rank 2" || { echo "FAIL wrong rank: $LAST"; fail=1; }
  check shape-huge 2 "$GF" bench "$DYN" --shape batch=4 --shape seq=1099511627776
  echo "$LAST" | grep -q "more than this machine's memory" || { echo "FAIL huge dim: $LAST"; fail=1; }
  check shape-unknown-name 2 "$GF" explain "$DYN" --shape seqlen=4
  check shape-malformed 2 "$GF" explain "$DYN" --shape x=2by3
  check shape-with-data 2 "$GF" run "$DYN" --data "$CLI_MODELS/dynamic_mlp_data" --shape seq=3
  # An input whose values become a shape: run plans for the values in the data.
  check run-value-shape-needs-data 2 "$GF" run "$CLI_MODELS/value_reshape.onnx"
  echo "$LAST" | grep -q "input 's': its values become a shape (input 1 of node 'Reshape_0' (Reshape))" \
    || { echo "FAIL value input without data: $LAST"; fail=1; }
else
  echo "FAIL make_cli_models.py (python3-onnx missing? scripts/setup.sh installs it)"; fail=1
fi
check run-no-model 2 "$GF" run
check run-dtype-unknown 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --dtype f64
echo "$LAST" | grep -q "f32, bf16 or f16" || { echo "FAIL run --dtype f64: the message does not name the dtypes"; fail=1; }
check run-dtype-cpu 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --dtype f16
echo "$LAST" | grep -q "backend cuda" || { echo "FAIL run --dtype f16 on the CPU: the message does not say where it runs"; fail=1; }
# --dtype bf16 on the CPU: the GEMM weights in bf16, against the stored references within bf16's tolerance.
check run-dtype-bf16-cpu 0 "$GF" run "$MODELS/llama_block_opset17/model.onnx" --data "$MODELS/llama_block_opset17/test_data_set_0" --dtype bf16
echo "$LAST" | grep -qE "^y .* ok$" || { echo "FAIL run --dtype bf16 on the CPU: $LAST"; fail=1; }
if "$GF" --help | grep -q -- "--emulate-gpu"; then
  check run-emulated-gpu 0 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data "$MODELS/mlp_gelu_opset17/test_data_set_0" --backend cuda --emulate-gpu
  echo "$LAST" | grep -q "cuda vs cpu" && ! echo "$LAST" | grep -q DIFFERS || { echo "FAIL run --emulate-gpu: no agreement with the CPU"; echo "$LAST"; fail=1; }
  # --dtype: the model converted to bf16 / f16 for the (emulated) GPU, against the CPU's f32 plan.
  for dt in bf16 f16; do
    check run-emulated-gpu-$dt 0 "$GF" run "$MODELS/llama_block_opset17/model.onnx" --data "$MODELS/llama_block_opset17/test_data_set_0" --backend cuda --emulate-gpu --dtype $dt
    echo "$LAST" | grep -q "cuda ($dt)" && echo "$LAST" | grep -q "cuda vs cpu" && ! echo "$LAST" | grep -q DIFFERS || { echo "FAIL run --dtype $dt: no $dt plan agreeing with the CPU"; echo "$LAST"; fail=1; }
  done
  # --tf32: the f32 GEMMs in TF32 (emulated: operands rounded to 10-bit mantissas), within TF32's tolerance.
  check run-emulated-gpu-tf32 0 "$GF" run "$MODELS/llama_block_opset17/model.onnx" --data "$MODELS/llama_block_opset17/test_data_set_0" --backend cuda --emulate-gpu --tf32
  echo "$LAST" | grep -q "f32 GEMMs in TF32" && echo "$LAST" | grep -q "cuda vs cpu" && ! echo "$LAST" | grep -q DIFFERS || { echo "FAIL run --tf32: no TF32 plan agreeing with the CPU"; echo "$LAST"; fail=1; }
fi
# --dtype for demo / bench / explain: run's parsing; a narrow dtype needs --backend cuda, said
# before any work.
check demo-dtype-unknown 2 "$GF" demo --preset llama-small --dtype f64
echo "$LAST" | grep -q "f32, bf16 or f16" || { echo "FAIL demo --dtype f64: the message does not name the dtypes"; fail=1; }
check demo-dtype-cpu 2 "$GF" demo --preset llama-small --dtype f16
echo "$LAST" | grep -q "backend cuda" && ! echo "$LAST" | grep -q "generating" || { echo "FAIL demo --dtype f16 on the CPU: $LAST"; fail=1; }
# A model with bf16 GEMM weights on the CPU: fused and unfused round different GEMM inputs to
# bf16, so they are compared within bf16's tolerance (f32's default failed them).
check bench-model-bf16-cpu 0 "$GF" bench "$MODELS/llama_block_opset17/model.onnx" --dtype bf16 --repeats 3
echo "$LAST" | grep -q "within 0.05 + 0.05" || { echo "FAIL bench MODEL --dtype bf16 on the CPU: $LAST"; fail=1; }
check bench-dtype-bf16-preset-cpu 2 "$GF" bench --preset chain --dtype bf16
echo "$LAST" | grep -q "has no GEMM" || { echo "FAIL bench --preset chain --dtype bf16 on the CPU: $LAST"; fail=1; }
check bench-dtype-cpu 2 "$GF" bench --preset chain --dtype f16
echo "$LAST" | grep -q "backend cuda" || { echo "FAIL bench --dtype f16 on the CPU: $LAST"; fail=1; }
check bench-block-dtype-cpu 2 "$GF" bench --preset llama-small --dtype f16
check demo-emulate-needs-cuda 2 "$GF" demo --preset llama-small --emulate-gpu
check bench-emulate-needs-cuda 2 "$GF" bench --preset chain --emulate-gpu
check explain-dtype-unknown 2 "$GF" explain "$MODELS/mlp_gelu_opset17/model.onnx" --dtype fp8
echo "$LAST" | grep -q "^graphfuse explain: --dtype takes f32, bf16 or f16" || { echo "FAIL explain --dtype fp8: $LAST"; fail=1; }
# explain --dtype: the model converted before planning; with --cuda-src the CUDA plan is the bf16 one.
check explain-dtype 0 "$GF" explain "$MODELS/llama_block_opset17/model.onnx" --dtype bf16 --cuda-src /tmp/graphfuse_cuda_src_bf16 --json /tmp/graphfuse_plan_bf16.json
echo "$LAST" | grep -q "computing in bf16" && echo "$LAST" | grep -q "generated row kernel rmsnorm_bf16_" \
  || { echo "FAIL explain --dtype bf16: no bf16 plan: $LAST"; fail=1; }
python3 -c "
import json; j=json.load(open('/tmp/graphfuse_plan_bf16.json'))
assert j['dtype'] == 'bf16' and j['target'] == 'cuda', j
" || { echo "FAIL explain --dtype --json does not record the dtype"; fail=1; }
# --past: the block with a KV cache; the fused plan appends to the cache inside one
# FusedCachedAttention and agrees with the unfused plan on y and the present rows.
check demo-past-bert 2 "$GF" demo --preset bert --past 4
for preset in llama-small gpt2; do
  check demo-past-$preset 0 "$GF" demo --preset $preset --seq 2 --past 16 --repeats 3 --json /tmp/graphfuse_block_past.json
  echo "$LAST" | grep -q "FusedCachedAttention" || { echo "FAIL demo --past ($preset): no FusedCachedAttention in the fused plan"; fail=1; }
  python3 -c "
import json; j=json.load(open('/tmp/graphfuse_block_past.json'))
assert j['config']['past'] == 16 and j['config']['seq'] == 2 and j['dtype'] == 'f32', j['config']
assert [o['name'] for o in j['outputs']] == ['y', 'present_key', 'present_value'], j['outputs']
assert all(o['ok'] for o in j['outputs']), j['outputs']
ops = [n['op'] for n in j['fused_plan_ops']]
assert ops.count('FusedCachedAttention') == 1 and 'Concat' not in ops, ops
" || { echo "FAIL demo --past ($preset) --json: outputs, check or fused ops"; fail=1; }
done
if "$GF" --help | grep -q -- "--emulate-gpu"; then
  # The decode step's CUDA plans (emulated) in every dtype, against the CPU's f32 plan.
  for dt in f32 bf16 f16; do
    check demo-emulated-gpu-$dt 0 "$GF" demo --preset llama-small --seq 1 --past 8 --backend cuda --emulate-gpu --dtype $dt --repeats 1 --json /tmp/graphfuse_block_emu.json
    python3 -c "
import json; j=json.load(open('/tmp/graphfuse_block_emu.json'))
assert j['dtype'] == '$dt' and j['emulate_gpu'], j
rows = j['cuda']
assert [r['plan'] for r in rows] == ['unfused', 'fused'] and all(r['ok'] and r['dtype'] == '$dt' for r in rows), rows
" || { echo "FAIL demo --emulate-gpu --dtype $dt: $LAST" | tail -20; fail=1; }
    # f32: the GPU's fused plan runs the cache's attention as one decode-attention node.
    if [ $dt = f32 ]; then
      echo "$LAST" | grep -q "fused_attention_0: decode attention" || { echo "FAIL demo --emulate-gpu: no decode attention on the GPU"; fail=1; }
    fi
  done
  check bench-emulated-gpu-bf16 0 "$GF" bench --preset gelu --elements 4096 --repeats 3 --backend cuda --emulate-gpu --dtype bf16 --json /tmp/graphfuse_bench_emu.json
  echo "$LAST" | grep -q "in bf16, outputs within" || { echo "FAIL bench --emulate-gpu --dtype bf16: $LAST"; fail=1; }
  grep -q '"dtype": *"bf16"' /tmp/graphfuse_bench_emu.json || { echo "FAIL bench --json lacks the dtype"; fail=1; }
fi
check run-cuda-graph-needs-cuda 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --cuda-graph
check run-tf32-needs-cuda 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --tf32
# --cpu-gemm forces the CPU's GEMM engine: each agrees with the data set's outputs, explain says
# which engine runs each GEMM and that the option forced it; an unknown engine is exit 2.
for engine in own onednn; do
  check "run-cpu-gemm-$engine" 0 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" \
    --data "$MODELS/mlp_gelu_opset17/test_data_set_0" --cpu-gemm "$engine"
done
check bench-cpu-gemm-own 0 "$GF" bench "$MODELS/mlp_gelu_opset17/model.onnx" --cpu-gemm own --repeats 3
check explain-cpu-gemm 0 "$GF" explain "$MODELS/mlp_gelu_opset17/model.onnx" --cpu-gemm onednn
echo "$LAST" | grep -q "oneDNN matmul, as the target's options force (--cpu-gemm onednn)" ||
  { echo "FAIL explain --cpu-gemm onednn does not say the engine was forced"; fail=1; }
check run-cpu-gemm-unknown 2 "$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --cpu-gemm fast
echo "$LAST" | grep -q "auto, rule, own or onednn" || { echo "FAIL --cpu-gemm fast does not list the engines"; fail=1; }
# --cpu-gemm rule: nothing timed, and explain says the rule chose.
check explain-cpu-gemm-rule 0 "$GF" explain "$MODELS/mlp_gelu_opset17/model.onnx" --cpu-gemm rule
echo "$LAST" | grep -q "(the rule: --cpu-gemm rule)" ||
  { echo "FAIL explain --cpu-gemm rule does not say the rule chose"; fail=1; }
# --backend cuda: exit 2 naming what is missing (no device, or a build without the toolkit);
# with a GPU, the GPU's outputs agree with the CPU's.
out=$("$GF" run "$MODELS/mlp_gelu_opset17/model.onnx" --data "$MODELS/mlp_gelu_opset17/test_data_set_0" --backend cuda 2>&1); rc=$?
if [ "$rc" -eq 2 ]; then
  echo "$out" | grep -q -E "no CUDA device|no CUDA backend" && echo "ok   run-cuda (exit 2: $(echo "$out" | tail -1))" \
    || { echo "FAIL run-cuda: exit 2 without saying why"; echo "$out"; fail=1; }
elif [ "$rc" -eq 0 ]; then
  echo "$out" | grep -q "cuda vs cpu" && ! echo "$out" | grep -q DIFFERS && echo "ok   run-cuda (GPU present)" \
    || { echo "FAIL run-cuda: no cuda vs cpu comparison, or a difference"; echo "$out"; fail=1; }
else
  echo "FAIL run-cuda: exit $rc"; echo "$out" | head -20; fail=1
fi
exit $fail
