// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based RNG. Dropout's keep-mask for element i depends only on (seed, i), so every
// kernel -- scalar reference, SIMD tile, fused group, CUDA -- draws the same mask.
#pragma once

#include <cstdint>

namespace graphfuse {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// The four 32-bit words of the Philox block for counter `block` under key `seed`.
struct PhiloxWords {
  uint32_t w[4];
};
inline PhiloxWords PhiloxBlock(uint64_t seed, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

// Returns the 32 random bits for element `index` under key `seed`: word (index % 4) of the
// Philox block for counter index / 4.
inline uint32_t PhiloxBits(uint64_t seed, uint64_t index) { return PhiloxBlock(seed, index >> 2).w[index & 3]; }

// The integer threshold of DropoutKeep: top 24 random bits below it are dropped.
inline uint32_t DropoutThreshold(float p) { return static_cast<uint32_t>(static_cast<double>(p) * 16777216.0); }

// Keep element `index` with probability 1 - p: its top 24 random bits, read as a uniform in
// [0, 1), must be >= p. The comparison is in integers so that every backend agrees exactly.
inline bool DropoutKeep(uint64_t seed, uint64_t index, float p) {
  return (PhiloxBits(seed, index) >> 8) >= DropoutThreshold(p);
}

// The factor kept elements are multiplied by in training mode.
inline float DropoutScale(float p) { return static_cast<float>(1.0 / (1.0 - static_cast<double>(p))); }

}  // namespace graphfuse
