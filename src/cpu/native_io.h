// Loads and stores of the CPU code generator's loops (cpu_codegen.h): one vector of f32 lanes
// from / to f32, f16 or bf16 storage, converting exactly as the tile executor's loads and
// stores do (f16 and bf16 widen exactly; narrowing rounds to nearest even; a NaN stays a quiet
// NaN, for bf16 the tile executor's (bits >> 16) | 0x40).
#pragma once

#include <cstring>

#include "cpu/simd.h"

namespace graphfuse::cpu::native {

using simd::VF;
namespace hn = hwy::HWY_NAMESPACE;
using DH = hn::Rebind<hwy::float16_t, simd::DF>;
using DB = hn::Rebind<hwy::bfloat16_t, simd::DF>;

inline VF LoadF32(const void* p, int64_t i) { return VF::Load(static_cast<const float*>(p) + i); }
inline VF LoadF16(const void* p, int64_t i) {
  return VF(hn::PromoteTo(simd::DF(), hn::LoadU(DH(), static_cast<const hwy::float16_t*>(p) + i)));
}
inline VF LoadBF16(const void* p, int64_t i) {
  return VF(hn::PromoteTo(simd::DF(), hn::LoadU(DB(), static_cast<const hwy::bfloat16_t*>(p) + i)));
}

inline void StoreF32(VF v, void* p, int64_t i) { v.Store(static_cast<float*>(p) + i); }
inline void StreamF32(VF v, void* p, int64_t i) { v.Stream(static_cast<float*>(p) + i); }
inline void StoreF16(VF v, void* p, int64_t i) {
  hn::StoreU(hn::DemoteTo(DH(), v.v), DH(), static_cast<hwy::float16_t*>(p) + i);
}
inline void StoreBF16(VF v, void* p, int64_t i) {
  const hn::RebindToSigned<simd::DF> di;
  const auto bits = hn::BitCast(di, v.v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 1));
  const auto rounded = hn::ShiftRight<16>(hn::BitCast(
      di, hn::Add(hn::BitCast(hn::RebindToUnsigned<simd::DF>(), bits),
                  hn::BitCast(hn::RebindToUnsigned<simd::DF>(), hn::Add(hn::Set(di, 0x7FFF), lsb)))));
  const auto nan = hn::Or(hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 0xFFFF)), hn::Set(di, 0x40));
  // Logical shifts of the 32-bit patterns: mask the sign extension of arithmetic shifts.
  const auto r = hn::And(hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(v.v)), nan, rounded), hn::Set(di, 0xFFFF));
  hn::StoreU(hn::DemoteTo(hn::Rebind<uint16_t, simd::DF>(), r), hn::Rebind<uint16_t, simd::DF>(),
             static_cast<uint16_t*>(p) + i);
}

// The last n < kLanes elements of a row: through a zero-padded buffer (the lanes past n are
// computed and dropped, as the tile executor's padding is).
template <class T, VF (*kLoad)(const void*, int64_t)>
inline VF LoadTail(const void* p, int64_t i, int64_t n) {
  alignas(64) T buf[simd::kLanes] = {};
  std::memcpy(buf, static_cast<const T*>(p) + i, static_cast<size_t>(n) * sizeof(T));
  return kLoad(buf, 0);
}
template <class T, void (*kStore)(VF, void*, int64_t)>
inline void StoreTail(VF v, void* p, int64_t i, int64_t n) {
  alignas(64) T buf[simd::kLanes];
  kStore(v, buf, 0);
  std::memcpy(static_cast<T*>(p) + i, buf, static_cast<size_t>(n) * sizeof(T));
}
inline VF LoadTailF32(const void* p, int64_t i, int64_t n) { return LoadTail<float, LoadF32>(p, i, n); }
inline VF LoadTailF16(const void* p, int64_t i, int64_t n) { return LoadTail<uint16_t, LoadF16>(p, i, n); }
inline VF LoadTailBF16(const void* p, int64_t i, int64_t n) { return LoadTail<uint16_t, LoadBF16>(p, i, n); }
inline void StoreTailF32(VF v, void* p, int64_t i, int64_t n) { StoreTail<float, StoreF32>(v, p, i, n); }
inline void StoreTailF16(VF v, void* p, int64_t i, int64_t n) { StoreTail<uint16_t, StoreF16>(v, p, i, n); }
inline void StoreTailBF16(VF v, void* p, int64_t i, int64_t n) { StoreTail<uint16_t, StoreBF16>(v, p, i, n); }

// One element, for inputs read once per row or once per launch.
inline float ScalarF32(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
inline float ScalarF16(const void* p, int64_t i) {
  _Float16 h;
  std::memcpy(&h, static_cast<const uint16_t*>(p) + i, 2);
  return static_cast<float>(h);
}
inline float ScalarBF16(const void* p, int64_t i) {
  const uint32_t b = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace graphfuse::cpu::native
