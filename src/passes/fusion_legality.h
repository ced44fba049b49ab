// Legality and policy of elementwise fusion, kept apart from the rewrite (MLIR's split):
// a check returns a decision -- allow, or a refusal with a stable code and a message that
// names both sides -- and the planner records every refusal for `graphfuse explain`.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/fusion.h"

namespace graphfuse {

// Stable refusal codes (part of the --json contract; never renamed, only added to).
namespace refusal {
inline constexpr const char* kNotElementwise = "not-elementwise";    // one side is not an op-table op
inline constexpr const char* kShapeMismatch = "shape-mismatch";      // different iteration spaces
inline constexpr const char* kDomainMismatch = "domain-mismatch";    // integer vs float compute
inline constexpr const char* kWouldCreateCycle = "would-create-cycle";  // a path leaves and re-enters
inline constexpr const char* kGroupTooLarge = "group-too-large";     // over max_group_size nodes
inline constexpr const char* kTooManyInputs = "too-many-inputs";     // over max_inputs tensors read
inline constexpr const char* kTooManyOutputs = "too-many-outputs";   // over max_outputs tensors written
inline constexpr const char* kExcluded = "excluded";                 // named in FusionOptions::exclude
inline constexpr const char* kDisabled = "fusion-disabled";          // FusionOptions::enabled == false
inline constexpr const char* kNotProfitable = "not-profitable";      // the cost policy says no
inline constexpr const char* kNormNotFoldable = "norm-not-foldable";  // an RMSNorm's scale cannot go into W
// FuseAttention's and FuseAttentionProjections': ranks, broadcast batches, an axis or a form the
// attention kernel does not take.
inline constexpr const char* kAttentionUnsupportedLayout = "attention-unsupported-layout";
}  // namespace refusal

struct FusionDecision {
  bool allowed = true;
  const char* code = "";
  std::string message;
  static FusionDecision Allow() { return {}; }
  static FusionDecision Refuse(const char* code, std::string message) { return {false, code, std::move(message)}; }
};


// A candidate group as legality sees it.
struct GroupSummary {
  std::string name;  // for messages: a member node's name
  Shape space;
  bool integer_domain = false;
  int size = 0;
  std::set<const Value*> reads;   // tensors read from outside the group
  std::set<const Value*> writes;  // tensors used outside the group or graph outputs
};

// Checks merging groups a and b (in either order) except for cycles, which the planner
// checks on the graph. `a_node` / `b_node` name the two nodes of the edge being considered.
FusionDecision CheckMerge(const GroupSummary& a, const GroupSummary& b, const GroupSummary& merged,
                          const FusionOptions& options);

// The cost policy: estimated time a merge saves (one launch, plus the traffic of tensors that
// no longer travel through memory); refuses when it is not above options.min_saving_us.
FusionDecision PolicyAllowsMerge(const GroupSummary& a, const GroupSummary& b, const GroupSummary& merged,
                                 const FusionOptions& options, double* saving_us = nullptr);

// Whether a fused norm, softmax or attention kernel takes tensors of dtype t: f32 always, f16 and
// bf16 where the target's kernels do (FusionOptions::narrow_row_kernels).
inline bool RowKernelTakes(DType t, const FusionOptions& options) {
  return t == DType::kF32 || (options.narrow_row_kernels && (t == DType::kF16 || t == DType::kBF16));
}

}  // namespace graphfuse
