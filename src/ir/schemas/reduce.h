// Which axes a reduction (ReduceSum, ReduceMean, ReduceMax, ...) reduces, shared by their
// inference (reduce.cc) and the CPU kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace graphfuse::schemas {

// The reduced axes (normalized, sorted) and whether the op is the identity.
struct ReduceAxes {
  std::vector<bool> reduced;  // per input dim
  bool noop = false;
};

// The reduced axes of an input of rank `rank` (axes in [-rank, rank), already checked): all of
// them when `axes` is empty, unless noop_with_empty_axes (`noop_with_empty`) makes the op the
// identity.
ReduceAxes MakeAxes(std::vector<int64_t> axes, int64_t rank, bool noop_with_empty);

}  // namespace graphfuse::schemas
