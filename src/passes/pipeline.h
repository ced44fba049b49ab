// The pass pipeline, in order, with the verifier after every pass:
//
//   FoldConstants     constants and shape-only subgraphs become constants
//   Canonicalize      identity Casts / one-input Concats go; decomposed LayerNorm / RMSNorm / GELU /
//                     SiLU / Softmax / RoPE -> one op each
//   CanonicalizeViews views between a GEMM and its readers move out of the way; slices of a
//                     packed projection become projections of their own
//   FuseAttention     scores MatMul -> scale/mask -> Softmax -> MatMul -> one FusedAttention
//   FuseAttentionCache  a KV cache's append (Concat of past and new rows) moves into the attention
//   FuseElementwise   groups of op-table nodes become FusedElementwise nodes (one kernel each)
//   FuseGemm          horizontal GEMMs (shared input) and GEMM epilogues -> FusedGemm
//   FuseAttentionProjections  the QKV GEMM(s) that only feed a FusedAttention move into it
//   FoldNormIntoGemm  an RMSNorm between two GEMMs folds into them
//   FuseRowwise       prologues / epilogues of norms and softmax -> FusedNorm / FusedSoftmax
//
// The Target decides what the passes may assume: its cost parameters price every merge, the
// forms only it runs (FuseAttentionProjections, FoldNormIntoGemm) run only for it, and
// FoldConstants evaluates nodes with it.
//
// With fusion disabled only FoldConstants runs (and FuseElementwise, which then records why
// nothing fused): the unfused baseline is the graph as written. Passes: fusion_passes.h.
//
// `print_after_each` writes the textual IR after every pass (for debugging a pass).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "fuse_elementwise.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

struct PipelineOptions {
  FILE* print_after_each = nullptr;  // nullptr: print nothing
  // fusion.enabled = false gives the unfused baseline. Its costs are replaced by the Target's,
  // and a target-specific form runs only where the Target asks for it and this leaves it on.
  FusionOptions fusion;
  FusionReport* fusion_report = nullptr;  // filled when not null
};

struct PassRecord {
  std::string pass;
  int changes = 0;  // what the pass reports it did (nodes folded, groups formed, ...)
};

// Runs every pass; an error names the pass (a verifier failure after a pass is a bug in it).
Result<std::vector<PassRecord>> RunPipeline(Graph& g, const Target& target, const PipelineOptions& options = {});

// The fusion options the passes see for `target`: options' own, with the target's costs and
// forms applied.
FusionOptions FusionOptionsFor(const Target& target, const FusionOptions& options);

}  // namespace graphfuse
