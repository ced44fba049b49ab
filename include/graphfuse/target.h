// A Target is a backend: what it runs, what fusion costs on it, which fused forms it wants, how
// it evaluates a node on the host, and how it compiles a planned graph into something that
// runs. The pass pipeline takes one (RunPipeline in src/passes/pipeline.h), so nothing above it
// switches on a backend's name; CompiledModel (graphfuse/model.h) compiles for one.
//
// A backend implements this interface (src/cpu/cpu_target.h, src/cuda/cuda_target.h) and
// is named in MakeTarget (src/runtime/targets.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

class Graph;
class Node;

// What the fusion cost policy prices a merge at on this device: one launch saved, plus the
// bytes that no longer travel through memory at this bandwidth.
struct TargetCosts {
  double launch_overhead_us = 1.0;
  double bandwidth_gbps = 40.0;
};

// Fused forms that only some backends run as one kernel. A pass that makes such a form runs
// only for a target that asks for it (and the user has not switched it off).
struct TargetForms {
  // An RMSNorm between two GEMMs folded into them (FoldNormIntoGemm).
  bool norm_into_gemm = false;
  // The QKV projection GEMM moved inside the attention kernel (FuseAttentionProjections).
  bool attention_projection = false;
  // Fused norm, softmax and attention kernels (FusedNorm, FusedSoftmax, FusedAttention,
  // FusedCachedAttention) over f16 / bf16 tensors, loading them into f32; without it those
  // fusions take f32 tensors only.
  bool narrow_row_kernels = false;
};

// How a target's kernel runs a node where it chooses among ways: which engine runs a GEMM, and
// why ("16x64 @ 64x64 (f32 weights, packed once): own tiles: ...").
struct KernelChoice {
  std::string node, op, how;
};

// One step of a run as a profiler sees it: a kernel launch, a library call or a copy.
struct StepTiming {
  const Node* node = nullptr;  // the node it runs; null for a step that is no node
  std::string label;           // the node's name, or what the step does
  int64_t start_ns = 0;        // std::chrono::steady_clock, since its epoch
  int64_t duration_ns = 0;
  // Timed on the device (CUDA events around the launch); start_ns is then the host's time of
  // the step's place in the run, the duration the device's.
  bool device = false;
};

// The clock StepTiming::start_ns reads.
inline int64_t SteadyClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Receives the steps of a profiled run (Executable::RunProfiled), in order, from the thread
// that runs it.
class RunProfiler {
 public:
  virtual ~RunProfiler() = default;
  virtual void OnStep(const StepTiming& step) = 0;
};

// What a compiled graph does per run and holds, as its target counts it.
struct ExecutableStats {
  int64_t launches = 0;         // kernel launches and library calls per run
  int64_t generated = 0;        // of those, kernels generated for this graph (CUDA: NVRTC)
  int64_t library_calls = 0;    // of those, library calls (cuBLAS / cuBLASLt)
  int64_t host_steps = 0;       // of those, nodes a device target runs on the host between copies
  // Intermediates: the bytes they take with buffers shared by liveness, and what every buffer
  // would add up to without reuse.
  int64_t activation_bytes = 0, activation_bytes_no_reuse = 0;
  int64_t device_bytes = 0;     // device memory held (buffers, constants, workspaces); 0 on the host
  // Compiling it: the time spent timing engines on this machine (the CPU's GEMMs, CpuGemmEngine::
  // kAuto) and the shape classes timed; 0 where every choice came from the cache.
  double tuning_ms = 0;
  int64_t tuned_classes = 0;
};

// Called after each node of an observed run (Executable::RunObserved) with its inputs and
// outputs as host buffers: checks of fused kernels against their original ops.
using NodeObserver =
    std::function<Status(const Node& node, std::span<const TensorView> in, std::span<const TensorView> out)>;

// A graph compiled for a target: runs it on host tensors.
class Executable {
 public:
  virtual ~Executable() = default;
  // One input per graph input and one output per graph output, each with the declared type
  // (outputs preallocated by the caller). Errors name the input or node at fault and leave the
  // executable usable. Safe to call from several threads at once.
  virtual Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs) = 0;
  // Run, telling `profiler` each step's time. By default the whole run is one step.
  virtual Status RunProfiled(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                             RunProfiler& profiler);
  // Run, showing `observer` each node's inputs and outputs (slow: for checks). Unimplemented
  // where the target's kernels do not run node by node on host buffers.
  virtual Status RunObserved(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                             const NodeObserver& observer);
  // The median time of `repeats` replays of the latest run, timed on the device (CUDA events),
  // in milliseconds; `median_wall_ms`, when given, the median host time from the first launch
  // to the end of the wait. Unimplemented where kernels run on the host (time Run there).
  virtual Result<double> DeviceRunMs(int repeats, double* median_wall_ms = nullptr);
  // Kernel launches (and library calls) one run makes.
  virtual int64_t launches_per_run() const = 0;
  // Launches and memory, as counted when it was compiled. By default only the launches.
  virtual ExecutableStats stats() const { return {.launches = launches_per_run()}; }
  // How it runs, a line per point, for a person: the kernels it generated, what runs on the
  // host, native loops compiled. None by default.
  virtual std::vector<std::string> Describe() const { return {}; }
  // Whether graph input (output = false) or output `index` may be given as a strided view
  // (TensorView::strides), read or written in place: a KV cache's past and present rows kept
  // in one buffer of larger capacity. Every other view Run is given is contiguous
  // (CompiledModel::Run copies strided ones).
  virtual bool TakesStrided(bool output, size_t index) const { return false; }
};

// Which code runs the CPU's GEMMs against constant weights. kAuto: the engine timed faster on
// this machine for the GEMM's shape class (its weights' shape and storage, its rows rounded up to
// a power of two, the threads), timed once per machine and cached under ~/.cache/graphfuse/gemm;
// `graphfuse explain` names it, the timings and whether they came from the cache. kRule: the
// built-in rule by rows and storage, nothing timed (runs that must not depend on a timing). kOwn
// (graphfuse's weight stream and tiles) or kOneDnn (oneDNN's packed matmul) force one for every
// such GEMM, for comparing the two; a GEMM the forced engine has no kernel for (oneDNN's bf16
// matmul below AVX-512) fails to compile, naming the node.
enum class CpuGemmEngine { kAuto, kRule, kOwn, kOneDnn };

// Each target's own options: MakeTarget reads the named target's, and refuses options set for
// a target it was not asked for.
struct CpuTargetOptions {
  // Threads of the pool each compiled model runs on (the calling thread counts); 0: the
  // hardware's.
  int threads = 0;
  // Fused elementwise loops compiled to native code by the host compiler at run time
  // (graphfuse/cpu_codegen.h); off: the tile executor interprets them.
  bool codegen = false;
  // GEMMs against constant weights hold them in bf16, rounded once when the plan is compiled;
  // activations, sums and every other kernel stay f32 (what ForDtype(kBF16) sets; `--dtype
  // bf16` on the CPU). Halves a decode step's weight stream; accurate to the bf16 tolerance of
  // the README.
  bool bf16_weights = false;
  CpuGemmEngine gemm = CpuGemmEngine::kAuto;  // `--cpu-gemm auto|rule|own|onednn`
};

struct CudaTargetOptions {
  int device = 0;
  // Each run replays its launches as one CUDA graph.
  bool graph = false;
  // Plans run on the host instead of a GPU (slow; checks plans without a GPU).
  bool emulate = false;
  // f32 GEMMs in TF32 (10-bit mantissa products, f32 sums): faster on tensor cores, about 1e-3
  // relative error instead of f32's 1e-7. Off: f32 GEMMs are exact f32.
  bool tf32 = false;
  // Prefill attention's form: "flash" (one kernel), "gemms" (cuBLAS GEMMs around a softmax), or
  // "" (chosen by shape).
  std::string prefill_attention;
  bool operator==(const CudaTargetOptions&) const = default;
};

struct TargetOptions {
  CpuTargetOptions cpu;
  CudaTargetOptions cuda;
};

class Target {
 public:
  virtual ~Target() = default;

  // "cpu", "cuda": what --backend names it.
  virtual std::string_view name() const = 0;
  virtual TargetCosts costs() const = 0;
  virtual TargetForms forms() const = 0;

  // Whether this target's own kernel registry has a kernel for `node` (a node without one
  // runs on the host, or makes compilation fail, as the backend documents).
  virtual bool HasKernel(const Node& node) const = 0;

  // Runs one node on host buffers (`in` as the node reads them, `out` preallocated with the
  // node's output types): constant folding evaluates nodes with it.
  virtual Status EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                                std::span<const TensorView> out) const = 0;

  // Compiles a graph the pipeline planned for this target. The executable shares ownership of
  // the graph and does not refer to the target afterwards.
  virtual Result<std::unique_ptr<Executable>> Compile(std::shared_ptr<const Graph> graph) const = 0;

  // The choices its kernels make for the nodes of a graph it planned, in graph order (the CPU:
  // the engine of each GEMM); none by default.
  virtual std::vector<KernelChoice> DescribeKernels(const Graph& graph) const { return {}; }

  // This target made to compute models in `dtype` (CompileOptions::dtype), as it runs that dtype
  // (the CPU: bf16 holds the GEMMs' constant weights in bf16; the CUDA target: the model
  // converted to bf16 or f16); Unimplemented, naming what it runs instead, for a dtype it does
  // not. The CPU and CUDA targets give f32 a target like this one; the default refuses every
  // dtype (a target that computes f32 only need not copy itself).
  virtual Result<std::unique_ptr<Target>> ForDtype(DType dtype) const;
  // The dtype models are converted to before the passes (ConvertPrecision; f32: none).
  virtual DType graph_dtype() const { return DType::kF32; }

  // Whether its results are the reference that other targets' are checked against (the CPU
  // computing in f32); a tool runs the reference beside any other target and compares.
  virtual bool is_reference() const { return false; }
  // The same-run bandwidth ceiling of the memory its kernels read: a copy of `bytes` there, the
  // median of `repeats`, in GB/s of read + write; Unimplemented where the caller measures the
  // host's (the CPU).
  virtual Result<double> CopyGbps(int64_t bytes, int repeats) const;
  // For a target that generates its kernels' code: writes the sources a graph it planned would
  // compile into folder `dir` (one file per kernel; no device needed) and returns a line per
  // node saying how it runs and which files are its kernels, then the count of files written.
  // Unimplemented by default.
  virtual Result<std::vector<std::string>> WriteKernelSources(const Graph& graph, const std::string& dir) const;

  // Whether its executables read fused nodes' "reference" graphs (to run a fused node whose
  // kernel is missing through its original ops, say). A target that never does may be handed
  // plans whose reference graphs are left out where they change with the sizes (plans made
  // from a shape-class template).
  virtual bool ReadsReferenceGraphs() const { return true; }
};

// The targets this build has: "cpu", and "cuda" when built with the CUDA toolkit.
std::vector<std::string> TargetNames();

// The target named `name`; NotFound naming the targets of this build (Unimplemented for one
// this build was made without), InvalidArgument for options given for another target, and the
// target's own refusal (a GPU target without a device).
Result<std::unique_ptr<Target>> MakeTarget(std::string_view name, const TargetOptions& options = {});

// The target every other is checked against (Target::is_reference), with options.cpu.
std::unique_ptr<Target> MakeReferenceTarget(const TargetOptions& options = {});

}  // namespace graphfuse
