// The textual IR: a deterministic printer and a parser, for tests and for humans debugging.
//
//   graph @block(%x: f32[2,8], %b: f32[8]) {
//     %w: f32[8,8] = const [0.5, ...64 values]
//     %0: f32[2,8] = MatMul(%x, %w)
//     %1: f32[2,8] = Add(%0, %b)
//     %2: f32[2,8] = LeakyRelu(%1) {alpha = 0.1}
//     return %2
//   }
//
// Names are %identifiers ([A-Za-z0-9_./-]+) or %"quoted". Attributes: int 3, float 1.5,
// string "s", ints [1, 2], floats [1.0, 2.0], tensor <f32[2]: 1, 2>. An omitted optional input
// prints as _. Output types are optional when parsing: given ones are checked against inference.
#pragma once

#include <memory>
#include <string>

#include "graphfuse/graph.h"

namespace graphfuse {

struct PrintOptions {
  int64_t max_constant_elements = 64;  // larger constants print as "<N elements>" (not parseable)
};

std::string PrintGraph(const Graph& g, const PrintOptions& options = {});

// Parses the textual IR; errors give line:column and what was expected.
Result<std::unique_ptr<Graph>> ParseGraph(const std::string& text);

}  // namespace graphfuse
