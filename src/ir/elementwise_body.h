// What a fused elementwise body may hold: the graph of op-table nodes that FusedElementwise
// runs ("body"), and that FusedGemm ("epilogue"), FusedNorm and FusedSoftmax run around their
// main computation. Every backend lowers any body within these limits (the CPU tile program is
// sized by them); the fusion passes form no larger one.
#pragma once

#include <cstddef>

namespace graphfuse {

// Rank of the iteration space, tensors read, instructions (one per node, plus one after each
// node whose stored dtype needs a rounding step: NeedsRoundingStep) and tensors written.
inline constexpr size_t kMaxBodyRank = 12, kMaxBodyInputs = 16, kMaxBodyInstrs = 48, kMaxBodyOutputs = 8;

}  // namespace graphfuse
