// The pass pipeline, in order, with the verifier after every pass:
//
//   FoldConstants     constants and shape-only subgraphs become constants
//   Canonicalize      decomposed LayerNorm / RMSNorm / GELU / SiLU / Softmax / RoPE -> one op each
//   FuseAttention     scores MatMul -> scale/mask -> Softmax -> MatMul -> one FusedAttention
//   FuseElementwise   groups of op-table nodes become FusedElementwise nodes (one kernel each)
//   FuseGemm          horizontal GEMMs (shared input) and GEMM epilogues -> FusedGemm
//   FuseAttentionProjections  the QKV FusedGemm that only feeds a FusedAttention moves into it
//   FuseRowwise       prologues / epilogues of norms and softmax -> FusedNorm / FusedSoftmax
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

namespace graphfuse {

struct PipelineOptions {
  FILE* print_after_each = nullptr;  // nullptr: print nothing
  FusionOptions fusion;              // fusion.enabled = false gives the unfused baseline
  FusionReport* fusion_report = nullptr;  // filled when not null
};

struct PassRecord {
  std::string pass;
  int changes = 0;  // what the pass reports it did (nodes folded, groups formed, ...)
};

// Runs every pass; an error names the pass (a verifier failure after a pass is a bug in it).
Result<std::vector<PassRecord>> RunPipeline(Graph& g, const PipelineOptions& options = {});

}  // namespace graphfuse
