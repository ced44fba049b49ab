// What fusion may do (FusionOptions) and what it did (FusionReport): the knobs a user sets and
// the account of every fused kernel and every refused merge, with a stable code per refusal
// (src/passes/fusion_legality.h lists the codes). `graphfuse explain` prints the report;
// Plan::report() (graphfuse/model.h) returns it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "graphfuse/target.h"

namespace graphfuse {

struct FusionOptions {
  bool enabled = true;
  int max_group_size = 24;  // nodes per group (each may add a rounding step: f16/bf16, i32 arithmetic)
  int max_inputs = 12;      // tensors a group reads
  int max_outputs = 6;      // tensors a group writes
  std::set<std::string> exclude;  // node names, or group names from a previous plan ("fused_3")
  // Cost policy. RunPipeline takes the costs from its Target (the defaults are the CPU's).
  TargetCosts costs;
  double min_saving_us = 0.0;  // a merge must save more than this
  int recompute_max_cost = 2;  // producers this cheap are recomputed instead of stored
  // Target-specific forms (TargetForms): RunPipeline runs each only where the Target asks for
  // it and it is left on here. The QKV projection inside the attention kernel
  // (FuseAttentionProjections); off leaves the QKV GEMM and the attention as two kernels.
  bool attention_projection = true;
  // An RMSNorm between two GEMMs folds into them (FoldNormIntoGemm): the producer writes each
  // row's 1/rms, the consumer's weights take the norm's scale.
  bool norm_into_gemm = true;
  // Norms, softmax and attention over f16 / bf16 fuse as they do over f32
  // (TargetForms::narrow_row_kernels).
  bool narrow_row_kernels = true;
};

struct FusedGroupInfo {
  std::string name;         // the FusedElementwise node: "fused_<k>"
  std::string kind = "elementwise";
  std::string kernel_name;  // "fused_add_mul_add_f32_<hash8>": readable in a profiler, stable
  std::vector<std::string> nodes;       // member node names, in order
  std::vector<std::string> recomputed;  // producers recomputed here (they also run elsewhere)
  std::string epilogue;  // GEMM groups: how the epilogue runs (FusedGemmEpilogueForm, src/passes/gemm_epilogue_form.h)
};

struct FusionRefusal {
  std::string producer, consumer;  // the two nodes (for siblings: the two readers)
  std::string code;                // a refusal:: code
  std::string message;
};

struct FusionReport {
  std::vector<FusedGroupInfo> groups;
  std::vector<FusionRefusal> refusals;
  int64_t kernels_before = 0;
  int64_t kernels_after = 0;
};

}  // namespace graphfuse
