// The `graphfuse` command. Exit codes: 0 ok, 1 results differ from expected, 2 bad input or usage.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "cli_common.h"
#include "cpu/elementwise_kernels.h"
#include "graphfuse/cpu.h"
#include "graphfuse/ops.h"
#include "graphfuse/progress.h"
#include "graphfuse/target.h"

namespace graphfuse::cli {

int RunDemo(Args& args);   // block_demo.cc
int RunModel(Args& args);  // run.cc
int Explain(Args& args);   // explain.cc
int Bench(Args& args);     // bench.cc

Result<std::shared_ptr<const Target>> MakeCommandTarget(const std::string& backend, const TargetOptions& options,
                                                        DType dtype) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Target> target, MakeTarget(backend, options));
  if (dtype == DType::kF32) return std::shared_ptr<const Target>(std::move(target));
  auto typed = target->ForDtype(dtype);
  if (!typed.ok()) return typed.status().WithContext(StrCat("--dtype ", DTypeName(dtype)));
  return std::shared_ptr<const Target>(std::move(*typed));
}

bool IsReferenceKind(const Target& t) {
  auto f32 = t.ForDtype(DType::kF32);
  return f32.ok() && (*f32)->is_reference();
}

int FailUsage(const std::string& command, const Status& s) {
  std::string m = s.message();
  if (m.rfind(command + ": ", 0) == 0) m.erase(0, command.size() + 2);
  std::fprintf(stderr, "graphfuse %s: %s\n", command.c_str(), m.c_str());
  return kExitBadInput;
}

Result<std::string> Args::Value(const std::string& name) {
  if (Done()) return InvalidArgument(command_, ": flag ", name, " needs a value");
  return Next();
}

Result<int64_t> Args::Int(const std::string& name, int64_t lo, int64_t hi) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    return InvalidArgument(command_, ": ", name, " expects an integer, got '", v, "'");
  if (x < lo || x > hi) return InvalidArgument(command_, ": ", name, " must be in [", lo, ", ", hi, "], got ", x);
  return static_cast<int64_t>(x);
}

Result<std::string> Args::Backend(const std::string& name) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  // The targets of this build, and cuda always (a build without it says so when it is asked for).
  std::vector<std::string> names = TargetNames();
  if (std::find(names.begin(), names.end(), "cuda") == names.end()) names.push_back("cuda");
  if (std::find(names.begin(), names.end(), v) != names.end()) return v;
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : " or ") + n;
  return InvalidArgument(command_, ": ", name, " must be ", list, ", got '", v, "'");
}

Result<DType> Args::Dtype(const std::string& name) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  if (v == "f32") return DType::kF32;
  if (v == "bf16") return DType::kBF16;
  if (v == "f16") return DType::kF16;
  return InvalidArgument(command_, ": ", name, " takes f32, bf16 or f16, not '", v, "'");
}

Result<CpuGemmEngine> Args::CpuGemm(const std::string& name) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  if (v == "auto") return CpuGemmEngine::kAuto;
  if (v == "rule") return CpuGemmEngine::kRule;
  if (v == "own") return CpuGemmEngine::kOwn;
  if (v == "onednn") return CpuGemmEngine::kOneDnn;
  return InvalidArgument(command_, ": ", name, " takes auto, rule, own or onednn, not '", v, "'");
}

Result<std::string> Args::OutputFile(const std::string& name) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  if (v.empty()) return InvalidArgument(command_, ": ", name, " needs a file name, got ''");
  const std::filesystem::path path(v);
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st))
    return InvalidArgument(command_, ": ", name, " '", v, "' is a directory, not a file");
  if (std::filesystem::exists(st)) {
    if (::access(v.c_str(), W_OK) != 0)
      return InvalidArgument(command_, ": ", name, " '", v, "' exists and cannot be written (", std::strerror(errno), ")");
    return v;
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(dir, ec))
    return InvalidArgument(command_, ": ", name, " '", v, "': directory '", dir.string(), "' does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return InvalidArgument(command_, ": ", name, " '", v, "': directory '", dir.string(), "' is not writable (",
                           std::strerror(errno), ")");
  return v;
}

Result<double> Args::Float(const std::string& name, double lo, double hi) {
  GF_ASSIGN_OR_RETURN(std::string v, Value(name));
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x))
    return InvalidArgument(command_, ": ", name, " expects a number, got '", v, "'");
  if (x < lo || x > hi) return InvalidArgument(command_, ": ", name, " must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

Result<std::unique_ptr<CpuCodegen>> AttachCodegen(CpuContext& ctx) {
  auto cg = CpuCodegen::Create();
  if (!cg.ok()) return cg.status().WithContext("--cpu-codegen");
  ctx.codegen = cg->get();
  return std::move(*cg);
}

namespace {

// The help text: one section per command (graphfuse COMMAND --help prints that one and the
// notes it refers to), then the notes.
struct HelpSection {
  const char* command;
  const char* text;
  bool fusion_flags, codegen, environment;
};

constexpr HelpSection kCommands[] = {
    {"demo", R"(  demo [--preset NAME] [--seq N] [--past L] [--threads T] [--repeats R] [--rtol R] [--atol A] [--profile]
       [--cpu-codegen] [--cpu-gemm auto|rule|own|onednn] [--backend cpu|cuda] [--emulate-gpu] [--dtype f32|bf16|f16]
       [--json FILE]
        builds a transformer block with the graph API (random weights; presets llama7b, the
        default: hidden 4096, 32 heads, ffn 11008, seq 32; llama-small: hidden 512, seq 128;
        gpt2 and bert: hidden 768, seq 128), runs it unfused (every op a kernel) and fused,
        checks they agree (|fused - unfused| <= atol + rtol*|unfused|; defaults 1e-4, 1e-3),
        and prints kernels per block, dispatch overhead, time outside the weight GEMMs (and
        its median ratio over rounds that run the two plans back to back), block latency
        (median of interleaved repeats), bytes moved and the fused groups; --profile
        adds the median time of every kernel of both plans; --cpu-codegen runs the fused plan's
        elementwise programs as native loops (see below); --cpu-gemm forces the CPU's GEMM
        engine in both plans, as for run; --backend cuda also runs both plans
        on GPU 0 (launched one by one, and replayed as one CUDA graph) and prints each plan's
        steps, launches, median device latency, median wall latency (first launch to the
        end of the wait) and the error against the CPU; with --profile, every step's median
        device time (exit 2 without a device); --emulate-gpu runs those CUDA plans on the host
        instead (as for run: slow, no GPU needed, no CUDA graph, no device times).
        --past L (llama7b, llama-small, gpt2) gives the block a KV cache as exported decoders
        have it: inputs past_key / past_value [batch, heads, L, head_dim], the new K (after
        RoPE) and V rows appended to them before attention, outputs present_key /
        present_value beside y, a causal mask over the L + N keys; the fused f32 plan runs it
        as one FusedCachedAttention (kernel kvcache_attention_...); --seq 1 --past L is one
        decode step. --dtype bf16|f16 (with --backend cuda) runs the GPU's plans on the block
        converted to that dtype, compared with the CPU's f32 unfused plan within the dtype's
        tolerance (5e-2 for bf16, 1e-2 for f16, unless --rtol / --atol are given); the CPU's
        plans stay f32 there. The GPU's block takes and gives x, y and the cache in that dtype
        (no casts at the edges), and fuses as in f32. On the CPU (--backend cpu), --dtype bf16
        holds both plans' GEMM weights in bf16 (rounded once; activations and sums f32): half
        the weight stream at decode. The JSON
        records preset, seq, past, dtype, every output's error and the fused plan's ops.
  demo --preset elementwise [--elements N] [--threads T] [--repeats R] [--json FILE]
        runs every op of the elementwise library as one kernel on random data
        (default N = 1048576 f32 elements, T = all cores), checks each against the float64
        reference, and prints a table: time per launch, GB/s, error in ulps, beside the
        same-run STREAM triad bandwidth and the cost of one thread-pool dispatch
)",
     false, true, true},
    {"run", R"(  run MODEL.onnx [--data DIR | --shape NAME=D0xD1x...] [--rtol R] [--atol A] [--threads T] [--json FILE]
                 [--cpu-codegen] [--cpu-gemm auto|rule|own|onednn] [--check-fusion] [--backend cpu|cuda] [--cuda-graph]
                 [--emulate-gpu] [--dtype f32|bf16|f16] [--tf32] [--cuda-attention flash|gemms] [--trace FILE]
                 [fusion flags]
        imports an ONNX model (opsets 1-24) for the shapes of its inputs (symbolic dims take
        the sizes in DIR, or those --shape gives; inputs whose values become shapes are read
        from DIR), prints the planning time, folds its constant and shape-only subgraphs, recognizes decomposed norms / GELU / SiLU / softmax / RoPE, fuses attention,
        GEMM epilogues, norm and softmax prologues and elementwise groups, runs it on the CPU
        on DIR/input_<i>.pb (random inputs without --data) and compares with DIR/output_<i>.pb
        when present (|out - ref| <= atol + rtol*|ref|; defaults rtol 1e-4, atol 1e-5).
        --check-fusion also runs every fused kernel's original ops on the same inputs and names
        the first group that differs. --backend cuda runs the same plan on GPU 0 (generated
        kernels compiled with NVRTC, cuBLAS / cuBLASLt GEMMs; --cuda-graph replays it as one
        CUDA graph), compares its outputs with the CPU's and reports the GPU's; exits 2 when
        there is no device or the build has no CUDA toolkit. --emulate-gpu runs that same CUDA
        plan on the host instead (generated kernels compiled as C++ by `c++`, one thread per
        CUDA thread; slow, no GPU needed): a check of the plan and of every generated kernel.
        --dtype bf16|f16 (with --backend cuda) runs the model converted to that dtype on the
        GPU: weights converted once, f32 inputs and outputs cast at the edges, kernels loading
        the narrow dtype and summing in f32; compared with the CPU's f32 plan within the dtype's
        tolerance (defaults rtol = atol = 5e-2 for bf16, 1e-2 for f16). Without --backend cuda,
        --dtype bf16 runs the CPU plan with its GEMMs' weights held in bf16 (rounded once when
        planned; activations and sums stay f32), compared with the references within bf16's
        tolerance; f16 needs --backend cuda.
        --tf32 (with --backend cuda) runs the f32 GEMMs (cuBLAS and cuBLASLt) in TF32
        (CUBLAS_COMPUTE_32F_FAST_TF32: each operand rounded to a 10-bit mantissa, f32 sums;
        --emulate-gpu rounds them so on the host) and compares within rtol = atol = 1e-2
        unless --rtol / --atol say otherwise; f16 / bf16 GEMMs are unaffected.
        --cpu-gemm picks the engine of the CPU's GEMMs against constant weights: auto (the
        default: the engine timed faster on this machine for the GEMM's weight shape and rows,
        timed once per machine and kept in ~/.cache/graphfuse/gemm; weights under 1 MiB take
        the rule), rule (the built-in rule by rows, nothing timed: reproducible runs), own
        (graphfuse's weight stream and tiles) or onednn (oneDNN's packed matmul) for every
        one; a GEMM the forced engine has no kernel for (oneDNN's bf16 matmul below AVX-512)
        exits 2 naming it.
        --cuda-attention picks how attention with many query rows per head (prefill) runs on
        the GPU: one flash-style kernel (flash, the default) or cuBLAS GEMMs around generated
        prep and softmax kernels (gemms).
        --trace FILE writes the run of the backend asked for as Chrome-trace JSON (open it in
        https://ui.perfetto.dev or chrome://tracing): a "run" event, a "plan" event for the
        planning, and one event per kernel named by its node, with args op, members (a fused
        kernel's original nodes), bytes (its operands and results), engine (the CPU: each
        GEMM's engine) and clock; on a GPU the kernels carry device times (CUDA events around
        each step, replayed once after the run), an emulated plan's run is one host-timed event
)",
     true, true, true},
    {"explain", R"(  explain MODEL.onnx [--shape NAME=D0xD1x...] [--dot FILE] [--json FILE] [--print-ir] [--cuda-src DIR]
                     [--print-ir-before=PASS] [--print-ir-after=PASS] [--dtype f32|bf16|f16]
                     [--cpu-gemm auto|rule|own|onednn] [fusion flags]
  explain --passes
        the fusion plan (for the shapes --shape binds where the model's dims are symbolic:
        NAME an input and its whole shape, or a symbolic dim and its size): groups, member nodes, kernel names, how each GEMM's epilogue runs on
        the CPU (added as the GEMM stores, per block while in L2, or a pass over whole rows;
        an RMSNorm between two GEMMs folded into them), every refusal with its reason code;
        --dot writes Graphviz with groups as clusters; --print-ir prints the IR after
        every pass; --cuda-src prints how each node would run on a GPU (generated kernel,
        cuBLAS, cuBLASLt epilogue, view; the CUDA plan keeps its RMSNorms as kernels) and
        writes every generated kernel's CUDA source to DIR (no GPU needed); without --cuda-src,
        which engine runs each GEMM on the CPU (own stream, own tiles, oneDNN) and why: timed
        (the timings, and whether from the cache) or the rule (--cpu-gemm: as for run);
        --dtype means what it means to run on that backend: with --cuda-src the model converted
        to bf16 / f16 (the plan and sources run --backend cuda --dtype runs), on the CPU bf16 is
        the f32 plan with bf16 GEMM weights and f16 an error; the JSON records the dtype, the
        target, (CPU) the GEMM engines (kernel_choices) and each pass that ran with its
        changes and time in ms (passes); --print-ir-before=PASS / --print-ir-after=PASS print
        the IR before / after that pass (a name --passes lists, or all; repeatable);
        --passes lists the passes in pipeline order with what each rewrites
)",
     true, false, false},
    {"bench", R"(  bench (MODEL.onnx [--shape NAME=D0xD1x...] [--generate PROMPT:NEW] | --preset NAME) [--elements N] [--threads T] [--repeats R]
                                     [--rtol R] [--atol A] [--json FILE] [--cpu-codegen] [--cpu-gemm auto|rule|own|onednn]
                                     [--backend cpu|cuda] [--emulate-gpu] [--dtype f32|bf16|f16] [--trace FILE]
                                     [fusion flags]
        times the unfused and the fused plan (of the shapes --shape binds, as for explain;
        the time planning them is printed) (medians of interleaved samples) after checking
        they agree as `run` checks (|fused - unfused| <= atol + rtol*|unfused|; defaults rtol
        1e-4, atol 1e-5; the largest errors are printed; exit 1 when they differ, with nothing
        timed); presets chain, gelu, silu, residual (f32, default 1048576 elements) also
        report GB/s beside a same-run STREAM triad and check against float64; the block
        presets llama7b, llama-small, gpt2, bert take the demo's flags and print its table;
        --cpu-codegen adds a third row, the fused plan with native loops, checked bit for bit;
        --cpu-gemm forces the CPU's GEMM engine in both plans, as for run (not with --generate);
        --backend cuda also times both plans on GPU 0 (median device time) beside a same-run
        device-to-device copy, after checking the GPU's outputs against the CPU's;
        --emulate-gpu runs those CUDA plans on the host instead (host times of one run, no copy);
        --dtype bf16|f16 (with --backend cuda) runs the GPU's plans on the model converted to
        that dtype, checked against the CPU's f32 plans within the dtype's tolerance (5e-2 for
        bf16, 1e-2 for f16, unless --rtol / --atol are given); on the CPU, --dtype bf16 (a
        model or a block preset) holds the GEMM weights in bf16 in both plans, which then agree
        within bf16's tolerance (they round different GEMM inputs to bf16); the block presets
        take the demo's --past, --dtype and --emulate-gpu; the JSON records the dtype;
        --generate PROMPT:NEW runs MODEL.onnx (a decoder exported with a KV cache: input_ids,
        [attention_mask], [position_ids], past_key_values.* in, logits and present.* out) as a
        serving loop does: greedy, a random prompt of PROMPT tokens, then NEW - 1 calls of one
        token with each present fed back as the past (every call a new length), fused, on the
        CPU, in f32 (--dtype bf16: the GEMM weights in bf16); prints prefill ms, mean and last
        per-token ms, the planning per call (median and max after the first decode), the
        weights its plans share, RSS after the first call, the first decode and the first
        generation, and peak RSS (medians of --repeats
        generations, default 3; later ones alternate copying the KV cache and keeping it in
        place; exit 1 when repeats give different tokens); GRAPHFUSE_BENCH_CALLS=1 prints each
        call of the first generation (its planning split, RSS after it);
        --trace FILE (a model or an elementwise preset) writes three more runs of each plan,
        every kernel timed, as Chrome-trace JSON (as run --trace; with --backend cuda also each
        GPU plan's steps in device time)
)",
     true, true, true},
    {"ops", R"(  ops   lists the op table: name, arity, class, integer support, cost, accuracy contract
)",
     false, false, false},
    {"help", R"(  help  this text (also -h, --help); COMMAND --help prints one command's part
)",
     false, false, false},
};

constexpr const char* kFusionFlags = R"(fusion flags: --no-fuse (every node its own kernel), --max-group-size N (1-24, default 24),
              --exclude NAME (a node, or a group "fused_<k>" of a previous plan; repeatable)
)";

constexpr const char* kCodegen = R"(--cpu-codegen: every f32 elementwise program of at most two dims (fused group, GEMM / norm
              epilogue, single op) becomes one loop over SIMD vectors with its intermediates
              in registers, compiled by the C++ compiler that built graphfuse ($CXX overrides)
              on its first run (about 2 s a kernel; kept in ~/.cache/graphfuse/cpu, or
              $GF_KERNEL_CACHE/cpu, up to 256 MiB, least recently used removed first) and
              bit-identical to the tile executor; programs outside that scope, or with no
              working compiler, run on the tile executor
)";

constexpr const char* kEnvironment = R"(environment: GF_KERNEL_CACHE=DIR keeps NVRTC-compiled CUDA kernels on disk between runs, and
             holds the native loops' cache (DIR/cpu instead of ~/.cache/graphfuse/cpu)
)";

constexpr const char* kExitCodes = "exit codes: 0 ok, 1 results differ from the reference, 2 bad input or usage\n";

// The whole text, or (command != nullptr) one command's section and the notes it refers to.
void PrintHelp(std::FILE* to, const char* command) {
  std::fputs("graphfuse: operator fusion for neural-network inference\n\nusage: graphfuse <command> [flags]\n\n", to);
  bool fusion = command == nullptr, codegen = command == nullptr, env = command == nullptr;
  if (command == nullptr) std::fputs("commands:\n", to);
  for (const HelpSection& h : kCommands) {
    if (command && std::strcmp(command, h.command) != 0) continue;
    std::fputs(h.text, to);
    fusion |= h.fusion_flags, codegen |= h.codegen, env |= h.environment;
  }
  if (fusion) std::fprintf(to, "\n%s", kFusionFlags);
  if (codegen) std::fprintf(to, "\n%s", kCodegen);
  if (env) std::fprintf(to, "\n%s", kEnvironment);
  std::fprintf(to, "\n%s", kExitCodes);
}

// Whether `command` has a section of its own.
bool HasHelp(const std::string& command) {
  for (const HelpSection& h : kCommands)
    if (command == h.command) return true;
  return false;
}

const char* ClassName(OpClass c) {
  switch (c) {
    case OpClass::kArith: return "arith";
    case OpClass::kActivation: return "activation";
    case OpClass::kCompare: return "compare";
    case OpClass::kLogical: return "logical";
    case OpClass::kSelect: return "select";
    case OpClass::kCast: return "cast";
    case OpClass::kRandom: return "random";
  }
  return "?";
}

int ListOps(Args& args) {
  if (!args.Done()) {
    std::fprintf(stderr, "graphfuse ops: unexpected argument '%s'\n", args.Next().c_str());
    return kExitBadInput;
  }
  std::printf("%-12s %5s %-10s %-5s %4s %4s  %s\n", "op", "arity", "class", "ints", "cost", "ulp", "expression");
  for (const OpInfo& op : AllOps())
    std::printf("%-12s %5d %-10s %-5s %4d %4d  %s\n", op.name, op.arity, ClassName(op.cls), op.int_ok ? "yes" : "no",
                op.cost, op.max_ulp, op.expr);
  std::printf("\n%zu ops; SIMD target %s, %d f32 lanes\n", AllOps().size(), cpu::SimdTargetName(), cpu::VectorLanes());
  return kExitOk;
}

}  // namespace
}  // namespace graphfuse::cli

int main(int argc, char** argv) {
  using namespace graphfuse::cli;
  if (argc < 2) {
    PrintHelp(stderr, nullptr);
    return kExitBadInput;
  }
  const std::string cmd = argv[1];
  Args args(cmd, std::vector<std::string>(argv + 2, argv + argc));
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    PrintHelp(stdout, nullptr);
    return kExitOk;
  }
  // COMMAND --help (or -h) anywhere among its flags: that command's part of the text.
  for (int i = 2; i < argc && HasHelp(cmd); ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      PrintHelp(stdout, cmd.c_str());
      return kExitOk;
    }
  // Long steps of compiling (the GEMM engines timed on a machine's first run) tell stderr, so
  // that seconds of timing are not silence.
  graphfuse::SetProgressSink(
      [](std::string_view line) { std::fprintf(stderr, "graphfuse: %.*s\n", static_cast<int>(line.size()), line.data()); });
  if (cmd == "demo") return RunDemo(args);
  if (cmd == "ops") return ListOps(args);
  if (cmd == "run") return RunModel(args);
  if (cmd == "explain") return Explain(args);
  if (cmd == "bench") return Bench(args);
  std::fprintf(stderr, "graphfuse: unknown command '%s' (try 'graphfuse --help')\n", cmd.c_str());
  return kExitBadInput;
}
