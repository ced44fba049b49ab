// The elementwise benchmark presets, as textual IR over rows x cols f32 elements. Used by
// `graphfuse bench --preset` and bench/bench_fusion.cc, so both time the same graphs.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace graphfuse {

struct ElementwisePreset {
  const char* name;
  const char* what;
  std::string (*text)(int64_t rows, int64_t cols);
};

std::span<const ElementwisePreset> ElementwisePresets();
const ElementwisePreset* FindElementwisePreset(const std::string& name);

}  // namespace graphfuse
