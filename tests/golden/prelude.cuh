namespace gf {

// The integer compute type (a one-word name, so that `i64(0)` is an expression).
using i64 = long long;

// graphfuse::DType's numbering (include/graphfuse/dtype.h).
enum : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kBool = 5 };

// graphfuse::OpAttrs: baked into each node's call as a constant.
struct Attrs {
  float alpha;
  float beta;
  int to;
  unsigned long long seed;
  bool training;
};

template <class T> __forceinline__ T select(T c, T t, T f) { return c != T(0) ? t : f; }
template <class T> __forceinline__ T lt(T x, T y) { return x < y ? T(1) : T(0); }
template <class T> __forceinline__ T eq(T x, T y) { return x == y ? T(1) : T(0); }
template <class T> __forceinline__ T logical_and(T x, T y) { return (x != T(0) && y != T(0)) ? T(1) : T(0); }
template <class T> __forceinline__ T logical_or(T x, T y) { return (x != T(0) || y != T(0)) ? T(1) : T(0); }
template <class T> __forceinline__ T logical_not(T x) { return x == T(0) ? T(1) : T(0); }

// NaN-propagating, like numpy.maximum / minimum; x when x == y (max(0, -0) == 0).
__forceinline__ float max(float x, float y) { return (x != x || y != y) ? x + y : (x < y ? y : x); }
__forceinline__ float min(float x, float y) { return (x != x || y != y) ? x + y : (y < x ? y : x); }
__forceinline__ long long max(long long x, long long y) { return x < y ? y : x; }
__forceinline__ long long min(long long x, long long y) { return y < x ? y : x; }

__forceinline__ float abs(float x) { return fabsf(x); }
// Two's complement wraps (abs(INT64_MIN) == INT64_MIN), never UB.
__forceinline__ long long abs(long long x) {
  return x < 0 ? static_cast<long long>(0ull - static_cast<unsigned long long>(x)) : x;
}

__forceinline__ float div(float x, float y) { return x / y; }
// Integer division truncates; x / 0 gives 0 and INT64_MIN / -1 wraps, instead of trapping.
__forceinline__ long long div(long long x, long long y) {
  if (y == 0) return 0;
  if (y == -1) return static_cast<long long>(0ull - static_cast<unsigned long long>(x));
  return x / y;
}

__forceinline__ float exp(float x) { return expf(x); }
__forceinline__ float exp_fast(float x) { return expf(x); }
__forceinline__ float expm1(float x) { return expm1f(x); }
__forceinline__ float log(float x) { return logf(x); }
__forceinline__ float log1p(float x) { return log1pf(x); }
__forceinline__ float sqrt(float x) { return sqrtf(x); }
__forceinline__ float erf(float x) { return erff(x); }
__forceinline__ float erfc(float x) { return erfcf(x); }
__forceinline__ float tanh(float x) { return tanhf(x); }
__forceinline__ float cos(float x) { return cosf(x); }
__forceinline__ float sin(float x) { return sinf(x); }
__forceinline__ float tan(float x) { return tanf(x); }
__forceinline__ float asin(float x) { return asinf(x); }
__forceinline__ float acos(float x) { return acosf(x); }
__forceinline__ float atan(float x) { return atanf(x); }
__forceinline__ float sinh(float x) { return sinhf(x); }
__forceinline__ float cosh(float x) { return coshf(x); }
__forceinline__ float asinh(float x) { return asinhf(x); }
__forceinline__ float acosh(float x) { return acoshf(x); }
__forceinline__ float atanh(float x) { return atanhf(x); }
__forceinline__ float floor(float x) { return floorf(x); }
__forceinline__ float ceil(float x) { return ceilf(x); }
// The remainder: truncating (fmodf) when a.alpha != 0, else flooring (sign of y); integers give
// 0 for y == 0 and y == -1 instead of trapping.
__forceinline__ float mod(float x, float y, const Attrs& a) {
  float r = fmodf(x, y);
  if (a.alpha == 0.f && r != 0.f && ((r < 0.f) != (y < 0.f))) r += y;
  return r;
}
__forceinline__ long long mod(long long x, long long y, const Attrs& a) {
  if (y == 0 || y == -1) return 0;
  long long r = x % y;
  if (a.alpha == 0.f && r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}
// Halves to even: rintf rounds in the default mode, to nearest even.
__forceinline__ float round_even(float x) { return rintf(x); }
__forceinline__ float pow(float x, float y) { return powf(x, y); }
// Integer power by squaring, wrapping; a negative exponent truncates toward zero (src/ops/scalar_math.h).
__forceinline__ long long pow(long long x, long long y) {
  if (y < 0) return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
  unsigned long long r = 1, b = static_cast<unsigned long long>(x);
  for (unsigned long long e = static_cast<unsigned long long>(y); e != 0; e >>= 1) {
    if (e & 1) r *= b;
    b *= b;
  }
  return static_cast<long long>(r);
}

// f16 / bf16 storage and conversions, by the PTX cvt instructions that cuda_fp16.h's
// __float2half_rn / __float2bfloat16_rn use (round to nearest even): NVRTC 13 does not bundle
// those headers, and a kernel must compile without the toolkit's include dir (bf16: sm_80+).
struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };
__forceinline__ unsigned short f16_bits(float x) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h; }
__forceinline__ float f16_value(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__forceinline__ unsigned short bf16_bits(float x) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h; }
__forceinline__ float bf16_value(unsigned short b) { return __uint_as_float(static_cast<unsigned int>(b) << 16); }

// Rounds to the precision of f16 / bf16 (round to nearest even), staying in float.
__forceinline__ float round_f16(float x) { return f16_value(f16_bits(x)); }
__forceinline__ float round_bf16(float x) { return bf16_value(bf16_bits(x)); }
__forceinline__ float round_to(float x, const Attrs& a) {
  return a.to == kF16 ? round_f16(x) : a.to == kBF16 ? round_bf16(x) : x;
}
// Integer data computes in 64 bits; i32 wraps and bool is x != 0, as their stores keep them.
__forceinline__ long long round_to(long long x, const Attrs& a) {
  return a.to == kI32 ? static_cast<long long>(static_cast<int>(x)) : a.to == kBool ? (x != 0) : x;
}

// Philox4x32-10, word (index % 4) of the block for counter index / 4 (src/ops/philox.h).
__forceinline__ unsigned int philox_bits(unsigned long long seed, unsigned long long index) {
  const unsigned long long block = index >> 2;
  unsigned int c0 = static_cast<unsigned int>(block), c1 = static_cast<unsigned int>(block >> 32), c2 = 0, c3 = 0;
  unsigned int k0 = static_cast<unsigned int>(seed), k1 = static_cast<unsigned int>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const unsigned long long p0 = static_cast<unsigned long long>(0xD2511F53u) * c0;
    const unsigned long long p1 = static_cast<unsigned long long>(0xCD9E8D57u) * c2;
    const unsigned int n0 = static_cast<unsigned int>(p1 >> 32) ^ c1 ^ k0;
    const unsigned int n1 = static_cast<unsigned int>(p1);
    const unsigned int n2 = static_cast<unsigned int>(p0 >> 32) ^ c3 ^ k1;
    const unsigned int n3 = static_cast<unsigned int>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  switch (index & 3) {
    case 0: return c0;
    case 1: return c1;
    case 2: return c2;
    default: return c3;
  }
}

// Keep with probability 1 - p: the top 24 random bits >= p * 2^24, compared in integers.
__forceinline__ float dropout(float x, const Attrs& a, long long idx) {
  if (!a.training) return x;
  const unsigned int threshold = static_cast<unsigned int>(static_cast<double>(a.alpha) * 16777216.0);
  const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(a.alpha)));
  const bool keep = (philox_bits(a.seed, static_cast<unsigned long long>(idx)) >> 8) >= threshold;
  return keep ? x * scale : x * 0.f;
}

// Float -> integer: truncate toward zero, saturate, NaN -> 0 (src/cpu/tile_program.cc).
template <class I> __forceinline__ I saturate(float v, float lo, float hi, I imin, I imax) {
  if (!(v == v)) return 0;
  if (v >= hi) return imax;
  if (v <= lo) return imin;
  return static_cast<I>(v);
}
__forceinline__ int sat_i32(float v) { return saturate<int>(v, -2147483648.f, 2147483648.f, -2147483647 - 1, 2147483647); }
__forceinline__ long long sat_i64(float v) {
  return saturate<long long>(v, -9223372036854775808.f, 9223372036854775808.f, -9223372036854775807ll - 1,
                             9223372036854775807ll);
}

// Loads: storage -> compute type (float or long long).
__forceinline__ float f32_of(float v) { return v; }
__forceinline__ float f32_of(f16 v) { return f16_value(v.bits); }
__forceinline__ float f32_of(bf16 v) { return bf16_value(v.bits); }
__forceinline__ float f32_of(int v) { return static_cast<float>(v); }
__forceinline__ float f32_of(long long v) { return static_cast<float>(v); }
__forceinline__ float f32_of(unsigned char v) { return v ? 1.f : 0.f; }
__forceinline__ long long i64_of(float v) { return sat_i64(v); }
__forceinline__ long long i64_of(f16 v) { return sat_i64(f16_value(v.bits)); }
__forceinline__ long long i64_of(bf16 v) { return sat_i64(bf16_value(v.bits)); }
__forceinline__ long long i64_of(int v) { return v; }
__forceinline__ long long i64_of(long long v) { return v; }
__forceinline__ long long i64_of(unsigned char v) { return v ? 1 : 0; }

// Stores: compute type -> storage, as the CPU's StoreRun converts.
__forceinline__ void store(float* p, float v) { *p = v; }
__forceinline__ void store(f16* p, float v) { p->bits = f16_bits(v); }
__forceinline__ void store(bf16* p, float v) { p->bits = bf16_bits(v); }
__forceinline__ void store(int* p, float v) { *p = sat_i32(v); }
__forceinline__ void store(long long* p, float v) { *p = sat_i64(v); }
__forceinline__ void store(unsigned char* p, float v) { *p = v != 0.f ? 1 : 0; }
__forceinline__ void store(float* p, long long v) { *p = static_cast<float>(v); }
__forceinline__ void store(f16* p, long long v) { p->bits = f16_bits(static_cast<float>(v)); }
__forceinline__ void store(bf16* p, long long v) { p->bits = bf16_bits(static_cast<float>(v)); }
__forceinline__ void store(int* p, long long v) { *p = static_cast<int>(v); }  // wraps, as in C and numpy
__forceinline__ void store(long long* p, long long v) { *p = v; }
__forceinline__ void store(unsigned char* p, long long v) { *p = v != 0 ? 1 : 0; }

__forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }

// A kernel's sizes, passed by value as its last parameter: the source names them, the launch
// gives their values (CudaKernelSource::sizes).
template <int N>
struct Sizes {
  long long v[N];
};

