// Constant folding at load time: a node whose inputs are all constants runs once and its
// outputs become constants; Shape and Size of a statically shaped value fold without running. With
// static input shapes, shape-only subgraphs (Shape -> Gather -> Concat -> Reshape) vanish.
//
//   %s = Shape(%x: f32[2,8])          %r = Reshape(%x, const [16])
//   %n = ReduceProd(%s)       ==>
//   %r = Reshape(%x, %n)
#pragma once

#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

struct FoldOptions {
  const Target* target = nullptr;       // evaluates the nodes (Target::EvaluateOnHost); required
  int64_t max_output_bytes = 64 << 20;  // larger results stay as run-time nodes
};

// Returns the number of nodes folded away.
Result<int> FoldConstants(Graph& g, const FoldOptions& options);

// Folds one node whose inputs are constants (or a Shape of a static value): its outputs become
// constants, the node is left dead. Importers call it as they build, so that an op whose
// output shape depends on an input's values (Reshape, Expand, Slice, ...) sees a constant.
Result<bool> FoldNodeIfConstant(Graph& g, Node* n, const FoldOptions& options);

}  // namespace graphfuse
