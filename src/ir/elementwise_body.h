// What a fused elementwise body may hold: the graph of op-table nodes that FusedElementwise
// runs ("body"), and that FusedGemm ("epilogue"), FusedNorm and FusedSoftmax run around their
// main computation. Every backend lowers any body within these limits (the CPU tile program is
// sized by them); the fusion passes form no larger one.
#pragma once

#include <cstddef>

#include "graphfuse/graph.h"

namespace graphfuse {

// Rank of the iteration space, tensors read, instructions (one per node, plus one after each
// node whose stored dtype needs a rounding step: NeedsRoundingStep) and tensors written.
inline constexpr size_t kMaxBodyRank = 12, kMaxBodyInputs = 16, kMaxBodyInstrs = 48, kMaxBodyOutputs = 8;

// Whether a body's op-table node computes in the integer domain (ComputesInIntegers over its
// inputs' dtypes). A body computes in one domain: that of its first node.
bool ComputesInIntegers(const Node& n);

// Checks that `body` is one: op-table nodes only, every node and output over the space of
// output 0, one compute domain, no constants (they are inputs), inputs of at most that rank,
// and the limits above. Errors name the body and the node at fault.
Status CheckElementwiseBody(const Graph& body);

}  // namespace graphfuse
