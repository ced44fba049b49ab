// The pass pipeline, in order, with the verifier after every pass:
//
//   FoldConstants    constants and shape-only subgraphs become constants
//
// `print_after_each` writes the textual IR after every pass (for debugging a pass).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse {

struct PipelineOptions {
  FILE* print_after_each = nullptr;  // nullptr: print nothing
};

struct PassRecord {
  std::string pass;
  int changes = 0;  // what the pass reports it did (nodes folded, groups formed, ...)
};

// Runs every pass; an error names the pass (a verifier failure after a pass is a bug in it).
Result<std::vector<PassRecord>> RunPipeline(Graph& g, const PipelineOptions& options = {});

}  // namespace graphfuse
