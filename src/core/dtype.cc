#include "graphfuse/dtype.h"

#include <cmath>

namespace graphfuse {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name == DTypeName(t)) return t;
  return InvalidArgument("unknown dtype '", name, "' (expected f32, f16, bf16, i32, i64 or bool)");
}

static uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary32 -> binary16, round-to-nearest-even, written out bit by bit so that it is an
// independent check of the vectorized hardware conversion used in the kernels.
uint16_t F32ToF16Bits(float f) {
  uint32_t x = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xFFu;
  uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return sign | 0x7C00u | (mant ? 0x200u | static_cast<uint16_t>(mant >> 13) : 0u);
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1F) return sign | 0x7C00u;  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return sign;  // below half of the smallest subnormal -> +-0
    mant |= 0x800000u;         // implicit bit
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: correct
  return sign | static_cast<uint16_t>(half);
}

float F16BitsToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // subnormal: value = mant * 2^-24
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t F32ToBF16Bits(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float RoundToDType(float f, DType t) {
  switch (t) {
    case DType::kF16: return F16BitsToF32(F32ToF16Bits(f));
    case DType::kBF16: return BF16BitsToF32(F32ToBF16Bits(f));
    default: return f;
  }
}

}  // namespace graphfuse
