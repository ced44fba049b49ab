// Element types. f16 and bf16 are storage formats: arithmetic runs in f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "graphfuse/status.h"

namespace graphfuse {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kBool};

// Bytes per element (bool is one byte holding 0 or 1).
size_t DTypeSize(DType t);
// "f32", "f16", "bf16", "i32", "i64", "bool".
const char* DTypeName(DType t);
Result<DType> ParseDType(std::string_view name);
inline bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Bit-exact conversions with round-to-nearest-even; NaN stays NaN (quiet), inf stays inf.
uint16_t F32ToF16Bits(float f);
float F16BitsToF32(uint16_t h);
uint16_t F32ToBF16Bits(float f);
inline float BF16BitsToF32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds a float to the nearest value representable in `t` (identity for f32).
float RoundToDType(float f, DType t);

}  // namespace graphfuse
