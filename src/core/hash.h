// FNV-1a hashes: the same value in every process and on every machine, so they name things
// that outlive a process (kernel-name suffixes, on-disk cache keys, seeds derived from names).
// Not for hash tables that face untrusted keys.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace graphfuse {

inline constexpr uint32_t kFnv32Basis = 2166136261u;
inline constexpr uint64_t kFnv64Basis = 14695981039346656037ull;

// 32-bit FNV-1a of `s`, continuing from `h` (chain calls to hash several strings).
inline uint32_t Fnv1a32(std::string_view s, uint32_t h = kFnv32Basis) {
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

// 64-bit FNV-1a of `s`, continuing from `h`.
inline uint64_t Fnv1a64(std::string_view s, uint64_t h = kFnv64Basis) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Eight lowercase hex digits of the 32-bit hash of `s`: the stable suffix of generated kernel
// names ("fused_add_mul_f32_1a2b3c4d").
inline std::string Hash8(std::string_view s) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", Fnv1a32(s));
  return hex;
}

}  // namespace graphfuse
