// A Target is a backend as the compiler sees it: what it runs, what fusion costs on it, which
// fused forms it wants, and how it evaluates a node on the host. The pass pipeline takes one
// (RunPipeline in src/passes/pipeline.h), so nothing above it switches on a backend's name.
//
// A backend implements this interface (src/cpu/cpu_target.h, src/cuda/cuda_target.h) and
// registers in MakeTarget (src/runtime/targets.cc).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

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
};

// The targets this build has: "cpu", and "cuda" when built with the CUDA toolkit.
std::vector<std::string> TargetNames();

// The target named `name` with its defaults; NotFound naming the targets of this build.
Result<std::unique_ptr<Target>> MakeTarget(std::string_view name);

}  // namespace graphfuse
