// The ceilings the op library is judged by, shared by bench_ops and bench_ratios: STREAM-style
// copy and triad loops and the hand-written AVX-512 + libmvec Add/GELU/SiLU loops, each split
// over a graphfuse::ThreadPool in 64-byte-aligned chunks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"

#ifdef __AVX512F__
// glibc libmvec, AVX-512 variants (x86_64 vector ABI, 'e' = AVX-512, 16 lanes).
extern "C" __m512 _ZGVeN16v_erff(__m512);
extern "C" __m512 _ZGVeN16v_expf(__m512);
#endif

namespace graphfuse::bench {

// A 1-D tensor of n elements; benchmark set-up aborts on failure.
inline Tensor Alloc(DType t, int64_t n) {
  auto r = Tensor::Empty(t, {n});
  GF_CHECK(r.ok(), r.status().ToString());
  return std::move(r).value();
}

// Uniform f32 data in [-3, 3], never within 1e-3 of zero (Div/Log/Reciprocal stay finite).
inline void FillUniform(Tensor& t, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v;
    do v = dist(rng);
    while (std::fabs(v) < 1e-3f);
    p[i] = v;
  }
}

// [begin, end) of one thread's share.
struct Range {
  int64_t begin, end;
};

// Thread tid's share of n floats out of nt, on 64-byte (16-float) boundaries.
inline Range Chunk(int64_t n, int tid, int nt) {
  const int64_t blocks = (n + 15) / 16;
  return {std::min(n, blocks * tid / nt * 16), std::min(n, blocks * (tid + 1) / nt * 16)};
}

// body(Range) on `threads` threads of the pool (1: inline on the caller, no dispatch).
template <class Body>
inline void RunSplit(ThreadPool& pool, int64_t n, int threads, Body&& body) {
  pool.Parallel(threads, [&](int tid, int nt) { body(Chunk(n, tid, nt)); });
}

// A plain loop; kept from becoming a memcpy call, whose non-temporal stores on large sizes
// would measure something no elementwise kernel does.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void CopyLoop(const float* __restrict b,
                                                                                   float* __restrict a, Range r) {
  for (int64_t i = r.begin; i < r.end; ++i) a[i] = b[i];
}

// STREAM triad: a = b + s * c.
inline void TriadLoop(const float* __restrict b, const float* __restrict c, float s, float* __restrict a, Range r) {
  for (int64_t i = r.begin; i < r.end; ++i) a[i] = b[i] + s * c[i];
}

inline void StreamCopy(ThreadPool& pool, const float* b, float* a, int64_t n, int threads) {
  RunSplit(pool, n, threads, [&](Range r) { CopyLoop(b, a, r); });
}

inline void StreamTriad(ThreadPool& pool, const float* b, const float* c, float s, float* a, int64_t n, int threads) {
  RunSplit(pool, n, threads, [&](Range r) { TriadLoop(b, c, s, a, r); });
}

// Agreement with a float64 reference value, as bench_ops has always checked it.
inline bool Near(float got, double want) { return std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-6; }

#ifdef __AVX512F__
// Hand-written AVX-512 loops: the bar that the op library's kernels are measured against.
// A masked tail handles n that is not a multiple of 16.

template <class F>
inline void Map1(const float* __restrict x, float* __restrict y, Range r, F f) {
  int64_t i = r.begin;
  for (; i + 32 <= r.end; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(y + i, f(a));
    _mm512_storeu_ps(y + i + 16, f(b));
  }
  for (; i < r.end; i += 16) {
    const __mmask16 m = r.end - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (r.end - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

inline __m512 GeluErf(__m512 x) {
  // 0.5x * (1 + erf(x / sqrt2)) == fma(0.5x, erf(x / sqrt2), 0.5x)
  const __m512 hx = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  const __m512 e = _ZGVeN16v_erff(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678f)));
  return _mm512_fmadd_ps(hx, e, hx);
}

inline __m512 SiluExp(__m512 x) {
  const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

inline void HandAddLoop(const float* __restrict a, const float* __restrict b, float* __restrict y, Range r) {
  int64_t i = r.begin;
  for (; i + 32 <= r.end; i += 32) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    _mm512_storeu_ps(y + i + 16, _mm512_add_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16)));
  }
  for (; i < r.end; i += 16) {
    const __mmask16 m = r.end - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (r.end - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

// y = gelu(x) (erf form, libmvec erff), y = silu(x) (libmvec expf), y = a + b; over the pool.
inline void HandGelu(ThreadPool& pool, const float* x, float* y, int64_t n, int threads) {
  RunSplit(pool, n, threads, [&](Range r) { Map1(x, y, r, GeluErf); });
}

inline void HandSilu(ThreadPool& pool, const float* x, float* y, int64_t n, int threads) {
  RunSplit(pool, n, threads, [&](Range r) { Map1(x, y, r, SiluExp); });
}

inline void HandAdd(ThreadPool& pool, const float* a, const float* b, float* y, int64_t n, int threads) {
  RunSplit(pool, n, threads, [&](Range r) { HandAddLoop(a, b, y, r); });
}
#endif  // __AVX512F__

}  // namespace graphfuse::bench
