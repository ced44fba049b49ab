// Printing a fusion plan: the text table of `explain`/`run`, its JSON, and a Graphviz graph.
#pragma once

#include <cstdio>
#include <string>

#include "graphfuse/graph.h"
#include "core/json.h"
#include "passes/fuse_elementwise.h"

namespace graphfuse::cli {

void PrintFusionReport(FILE* f, const FusionReport& r);
// Adds "kernels_unfused", "kernels_fused", "groups" and "refusals" (the --json keys of the
// command-line contract, docs/ARCHITECTURE.md).
void AddFusionJson(Json& j, const FusionReport& r);
// The fused graph with each group as a cluster of its member ops (refusals as comments).
std::string FusionDot(const Graph& fused, const FusionReport& r);

// Fusion flags shared by run, explain and bench: --no-fuse, --max-group-size N, --exclude NAME.
// Returns true when `flag` was one of them (consuming its value).
Result<bool> ParseFusionFlag(const std::string& flag, class Args& args, FusionOptions* o);

}  // namespace graphfuse::cli
