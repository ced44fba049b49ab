// The pass pipeline, in order, with the verifier after every pass:
//
//   FoldConstants     constants and shape-only subgraphs become constants
//   FuseElementwise   groups of op-table nodes become FusedElementwise nodes (one kernel each)
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
