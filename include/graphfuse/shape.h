// Static shapes and NumPy/ONNX multidirectional broadcasting.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graphfuse/status.h"

namespace graphfuse {

using Shape = std::vector<int64_t>;

// "[2,3,4]"; a scalar (rank 0) prints as "[]".
std::string ShapeToString(const Shape& s);

// The product of the dims; an error on a negative dim or when the count overflows int64.
Result<int64_t> NumElements(const Shape& s);

// Broadcasts shapes right-aligned: each dim pair must be equal or one of them 1.
// The error names every shape and the first dim that disagrees.
Result<Shape> BroadcastShapes(std::span<const Shape> shapes);

// Element strides for reading `in` as if it had shape `out` (which it broadcasts to):
// one stride per dim of `out`, 0 where `in` is broadcast. Requires a valid broadcast.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out);

// Row-major contiguous strides (in elements).
std::vector<int64_t> ContiguousStrides(const Shape& s);

}  // namespace graphfuse
