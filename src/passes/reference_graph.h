// The reference graph of a fused node: the nodes it replaces, copied into a graph of their own
// that reads the fused node's inputs one to one. `run --check-fusion` runs it against the fused
// kernel, and a backend without the fused form runs it instead.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/status.h"

namespace graphfuse {

// `members` (in graph order) copied into a new graph named `name`: its inputs are `inputs`, in
// order (a name met twice gets ".in<i>"), the constants the members read are copied in, and
// `outputs` (values the members compute) are its outputs. A member reading anything else is an
// Internal error naming `name` and the member.
Result<std::shared_ptr<Graph>> BuildReferenceGraph(const std::string& name, const std::vector<Value*>& inputs,
                                                   const std::vector<Node*>& members,
                                                   const std::vector<const Value*>& outputs);

}  // namespace graphfuse
