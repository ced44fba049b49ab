// The op-table vocabulary for SIMD: T = VF, one vector of f32 lanes of the build's static
// Highway target (AVX-512 on the project's machines). Arithmetic and compares come from
// Highway; expm1/log/log1p/tanh/pow, the trigonometric functions and their inverses and the
// hyperbolic ones from SLEEF's 1-ulp vector functions, which keep IEEE behaviour over the whole
// domain (inf, NaN, 0, denormals; Highway's math documents narrower valid ranges; the few
// inputs past SLEEF's stated ranges go to C's functions, BeyondRange); erf/erfc from glibc's
// libmvec (several times faster than SLEEF's u10 erf).
// exp is inline (ExpInline below, one function for AVX-512 and AVX2, the same bits on both):
// within 1 ulp of the correctly rounded result on every 61st f32 (tests/ops_test.cc), and
// faster than SLEEF's expf (bench/RESULTS.md, "The op library") and than libmvec's, which is
// also less accurate (2.1-2.5 ulp).
// exp_fast names the rows whose contracts would accept a less accurate exp (Silu, Sigmoid,
// Softplus: 3 ulp), and exp_softmax the exp of softmax rows (softmax_row.h, d <= 0); on both
// x86 targets they are that same exp.
// No per-op intrinsics.
#pragma once

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "graphfuse/ops.h"
#include "ops/philox.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#include <sleef.h>
#endif

namespace graphfuse::simd {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VecF = hn::Vec<DF>;

inline constexpr int kLanes = static_cast<int>(HWY_LANES(float));

struct VF {
  VecF v;
  VF() = default;
  VF(VecF x) : v(x) {}                                           // NOLINT
  VF(double s) : v(hn::Set(DF(), static_cast<float>(s))) {}      // NOLINT: T(0.5) in the table
  static VF Load(const float* p) { return VF(hn::LoadU(DF(), p)); }
  void Store(float* p) const { hn::StoreU(v, DF(), p); }
  void Stream(float* p) const { hn::Stream(v, DF(), p); }  // p aligned to the vector
};

inline VF operator+(VF a, VF b) { return a.v + b.v; }
inline VF operator-(VF a, VF b) { return a.v - b.v; }
inline VF operator*(VF a, VF b) { return a.v * b.v; }
inline VF operator/(VF a, VF b) { return a.v / b.v; }
inline VF operator-(VF a) { return hn::Neg(a.v); }

inline VF One() { return hn::Set(DF(), 1.0f); }
inline VF select(VF c, VF t, VF f) { return hn::IfThenElse(hn::Ne(c.v, hn::Zero(DF())), t.v, f.v); }
inline VF lt(VF x, VF y) { return hn::IfThenElseZero(hn::Lt(x.v, y.v), One().v); }
inline VF eq(VF x, VF y) { return hn::IfThenElseZero(hn::Eq(x.v, y.v), One().v); }
inline VF logical_and(VF x, VF y) {
  const auto z = hn::Zero(DF());
  return hn::IfThenElseZero(hn::And(hn::Ne(x.v, z), hn::Ne(y.v, z)), One().v);
}
inline VF logical_or(VF x, VF y) {
  const auto z = hn::Zero(DF());
  return hn::IfThenElseZero(hn::Or(hn::Ne(x.v, z), hn::Ne(y.v, z)), One().v);
}
inline VF logical_not(VF x) { return hn::IfThenElseZero(hn::Eq(x.v, hn::Zero(DF())), One().v); }

// NaN-propagating, and x when x == y (so max(0, -0) == 0), exactly as scalar_math.h.
inline VF max(VF x, VF y) { return hn::IfThenElse(hn::IsNaN(y.v), y.v, hn::IfThenElse(hn::Lt(x.v, y.v), y.v, x.v)); }
inline VF min(VF x, VF y) { return hn::IfThenElse(hn::IsNaN(y.v), y.v, hn::IfThenElse(hn::Lt(y.v, x.v), y.v, x.v)); }
inline VF abs(VF x) { return hn::Abs(x.v); }
inline VF div(VF x, VF y) { return x.v / y.v; }
inline VF sqrt(VF x) { return hn::Sqrt(x.v); }
inline VF floor(VF x) { return hn::Floor(x.v); }
inline VF ceil(VF x) { return hn::Ceil(x.v); }
inline VF round_even(VF x) { return hn::Round(x.v); }  // to nearest, halves to even
// C's fmod lane by lane: exact for every pair (SLEEF's vector fmod is not, for a subnormal
// divisor of a huge dividend), and Mod is rare in models.
inline VF fmod(VF x, VF y) {
  alignas(64) float a[kLanes], b[kLanes];
  x.Store(a), y.Store(b);
  for (int i = 0; i < kLanes; ++i) a[i] = std::fmod(a[i], b[i]);
  return VF::Load(a);
}
// As scalar_math.h's mod: truncating remainder, or flooring (sign of y) when a.alpha == 0.
template <class A>
inline VF mod(VF x, VF y, const A& a) {
  const VecF r = fmod(x, y).v;
  if (a.alpha != 0.f) return r;
  const auto z = hn::Zero(DF());
  const auto adjust = hn::And(hn::Ne(r, z), hn::Xor(hn::Lt(r, z), hn::Lt(y.v, z)));
  return hn::IfThenElse(adjust, hn::Add(r, y.v), r);
}
// y, with the lanes where |x| > limit recomputed by C's f: SLEEF's sinh / cosh (|x| <= 88.5) and
// asinh / acosh (|x| <= 1.8e19) may give inf beyond their stated range where the result is finite.
template <class F>
inline VF BeyondRange(VF y, VF x, float limit, F f) {
  if (hn::AllFalse(DF(), hn::Gt(hn::Abs(x.v), hn::Set(DF(), limit)))) [[likely]] return y;
  alignas(64) float xs[kLanes], ys[kLanes];
  x.Store(xs), y.Store(ys);
  for (int i = 0; i < kLanes; ++i)
    if (std::fabs(xs[i]) > limit) ys[i] = f(xs[i]);
  return VF::Load(ys);
}
inline constexpr float kSleefHyperbolicLimit = 88.5f, kSleefInverseHyperbolicLimit = 1.8e19f;

}  // namespace graphfuse::simd

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
namespace graphfuse::simd {
// e^x = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 in two steps (ln 2's high part has 9
// significant bits, so n * hi is exact for |n| < 2^15), |r| <= ln 2 / 2. p is a degree-6
// polynomial with p(0) = p'(0) = 1 and the rest fitted to e^r over that interval by iterated
// weighted least squares on relative error (0.05 f32 half-ulps of truncation error). Returns p
// and n; ScaleByPowerOfTwo multiplies by 2^n.
inline VecF ExpPolynomial(VecF x, VecF* n_out) {
  const DF d;
  const VecF n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  VecF r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  VecF p = hn::Set(d, 1.381461276e-03f);
  p = hn::MulAdd(p, r, hn::Set(d, 8.368710056e-03f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.166838899e-02f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.666652113e-01f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.999999404e-01f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  *n_out = n;
  return p;
}

#if HWY_TARGET <= HWY_AVX3
// p * 2^n with one rounding (vscalefps), +inf past FLT_MAX: x is clamped to 89 (e^89 overflows).
inline VecF ScaleByPowerOfTwo(VecF p, VecF n) { return VecF{_mm512_scalef_ps(p.raw, n.raw)}; }
inline constexpr float kExpHigh = 89.f;
inline constexpr bool kExpSetsInf = false;
#else
// p * 2^n by adding n to p's exponent field (p in [0.7, 1.42]): exact while the result is
// normal, so x is clamped to 88.7228317 (the largest float whose e^x rounds to a finite float)
// and lanes above it are set to +inf.
inline VecF ScaleByPowerOfTwo(VecF p, VecF n) {
  return VecF{_mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(p.raw), _mm256_slli_epi32(_mm256_cvttps_epi32(n.raw), 23)))};
}
inline constexpr float kExpHigh = 88.7228317f;
inline constexpr bool kExpSetsInf = true;
#endif

// One exp for AVX-512 and AVX2, the same bits on both. The main path clamps x to
// [-87.3, kExpHigh] (normal results). Lanes outside take one compare and a rare second pass:
// +0 at and below -104 (e^x is under half the smallest subnormal there, so +0 is the correctly
// rounded result; softmax_row.h relies on it), +inf above kExpHigh where the scaling does not
// give it, and in (-104, -87.3) (subnormal results) 2^(n + 64) then a multiply by 2^-64, one
// rounding. A subnormal or zero result costs a microcode assist on Intel cores, many times the
// whole function, and every lane of a masked softmax key (-1e9) would pay it: hence the
// separate pass. A NaN passes the clamps (max/min return their second
// operand, x, when it is NaN) and propagates (on AVX2 its n converts to INT_MIN, whose shift is
// 0); its compares are false.
inline VF ExpInline(VF v) {
  const DF d;
  const VecF x = v.v, lo = hn::Set(d, -87.3f), hi = hn::Set(d, kExpHigh), zero_below = hn::Set(d, -104.f);
  VecF n;
  const VecF p = ExpPolynomial(hn::Min(hi, hn::Max(lo, x)), &n);
  VecF y = ScaleByPowerOfTwo(p, n);
  const auto below = hn::Lt(x, lo);
  auto outside = below;
  if constexpr (kExpSetsInf) outside = hn::Or(below, hn::Gt(x, hi));
  if (!hn::AllFalse(d, outside)) [[unlikely]] {
    y = hn::IfThenZeroElse(below, y);
    if constexpr (kExpSetsInf) y = hn::IfThenElse(hn::Gt(x, hi), hn::Inf(d), y);
    const auto subnormal = hn::And(below, hn::Gt(x, zero_below));
    if (!hn::AllFalse(d, subnormal)) {
      VecF m;
      const VecF q = ExpPolynomial(hn::Max(zero_below, x), &m);
      const VecF tiny = hn::Mul(ScaleByPowerOfTwo(q, hn::Add(m, hn::Set(d, 64.f))), hn::Set(d, 0x1p-64f));
      y = hn::IfThenElse(subnormal, tiny, y);
    }
  }
  return y;
}
inline VF exp(VF x) { return ExpInline(x); }
inline VF exp_fast(VF x) { return ExpInline(x); }
inline VF exp_softmax(VF x) { return ExpInline(x); }
}  // namespace graphfuse::simd
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
extern "C" __m512 _ZGVeN16v_erff(__m512);
extern "C" __m512 _ZGVeN16v_erfcf(__m512);
namespace graphfuse::simd {
inline VF erf(VF x) { return VecF{_ZGVeN16v_erff(x.v.raw)}; }
inline VF erfc(VF x) { return VecF{_ZGVeN16v_erfcf(x.v.raw)}; }
inline VF pow(VF x, VF y) { return VecF{Sleef_powf16_u10(x.v.raw, y.v.raw)}; }
inline VF expm1(VF x) { return VecF{Sleef_expm1f16_u10(x.v.raw)}; }
inline VF log(VF x) { return VecF{Sleef_logf16_u10(x.v.raw)}; }
inline VF log1p(VF x) { return VecF{Sleef_log1pf16_u10(x.v.raw)}; }
inline VF tanh(VF x) { return VecF{Sleef_tanhf16_u10(x.v.raw)}; }
inline VF cos(VF x) { return VecF{Sleef_cosf16_u10(x.v.raw)}; }
inline VF sin(VF x) { return VecF{Sleef_sinf16_u10(x.v.raw)}; }
inline VF tan(VF x) { return VecF{Sleef_tanf16_u10(x.v.raw)}; }
inline VF asin(VF x) { return VecF{Sleef_asinf16_u10(x.v.raw)}; }
inline VF acos(VF x) { return VecF{Sleef_acosf16_u10(x.v.raw)}; }
inline VF atan(VF x) { return VecF{Sleef_atanf16_u10(x.v.raw)}; }
inline VF sinh(VF x) {
  return BeyondRange(VecF{Sleef_sinhf16_u10(x.v.raw)}, x, kSleefHyperbolicLimit, [](float a) { return std::sinh(a); });
}
inline VF cosh(VF x) {
  return BeyondRange(VecF{Sleef_coshf16_u10(x.v.raw)}, x, kSleefHyperbolicLimit, [](float a) { return std::cosh(a); });
}
inline VF asinh(VF x) {
  return BeyondRange(VecF{Sleef_asinhf16_u10(x.v.raw)}, x, kSleefInverseHyperbolicLimit,
                     [](float a) { return std::asinh(a); });
}
inline VF acosh(VF x) {
  return BeyondRange(VecF{Sleef_acoshf16_u10(x.v.raw)}, x, kSleefInverseHyperbolicLimit,
                     [](float a) { return std::acosh(a); });
}
inline VF atanh(VF x) { return VecF{Sleef_atanhf16_u10(x.v.raw)}; }
}  // namespace graphfuse::simd
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
extern "C" __m256 _ZGVdN8v_erff(__m256);
extern "C" __m256 _ZGVdN8v_erfcf(__m256);
namespace graphfuse::simd {
inline VF erf(VF x) { return VecF{_ZGVdN8v_erff(x.v.raw)}; }
inline VF erfc(VF x) { return VecF{_ZGVdN8v_erfcf(x.v.raw)}; }
inline VF pow(VF x, VF y) { return VecF{Sleef_powf8_u10(x.v.raw, y.v.raw)}; }
inline VF expm1(VF x) { return VecF{Sleef_expm1f8_u10(x.v.raw)}; }
inline VF log(VF x) { return VecF{Sleef_logf8_u10(x.v.raw)}; }
inline VF log1p(VF x) { return VecF{Sleef_log1pf8_u10(x.v.raw)}; }
inline VF tanh(VF x) { return VecF{Sleef_tanhf8_u10(x.v.raw)}; }
inline VF cos(VF x) { return VecF{Sleef_cosf8_u10(x.v.raw)}; }
inline VF sin(VF x) { return VecF{Sleef_sinf8_u10(x.v.raw)}; }
inline VF tan(VF x) { return VecF{Sleef_tanf8_u10(x.v.raw)}; }
inline VF asin(VF x) { return VecF{Sleef_asinf8_u10(x.v.raw)}; }
inline VF acos(VF x) { return VecF{Sleef_acosf8_u10(x.v.raw)}; }
inline VF atan(VF x) { return VecF{Sleef_atanf8_u10(x.v.raw)}; }
inline VF sinh(VF x) {
  return BeyondRange(VecF{Sleef_sinhf8_u10(x.v.raw)}, x, kSleefHyperbolicLimit, [](float a) { return std::sinh(a); });
}
inline VF cosh(VF x) {
  return BeyondRange(VecF{Sleef_coshf8_u10(x.v.raw)}, x, kSleefHyperbolicLimit, [](float a) { return std::cosh(a); });
}
inline VF asinh(VF x) {
  return BeyondRange(VecF{Sleef_asinhf8_u10(x.v.raw)}, x, kSleefInverseHyperbolicLimit,
                     [](float a) { return std::asinh(a); });
}
inline VF acosh(VF x) {
  return BeyondRange(VecF{Sleef_acoshf8_u10(x.v.raw)}, x, kSleefInverseHyperbolicLimit,
                     [](float a) { return std::acosh(a); });
}
inline VF atanh(VF x) { return VecF{Sleef_atanhf8_u10(x.v.raw)}; }
}  // namespace graphfuse::simd
#else
#include <cmath>
namespace graphfuse::simd {
// Targets without a vector erf/pow binding: lane by lane (correct, slow; not the project's machines).
template <class F>
inline VF PerLane(VF x, VF y, F f) {
  alignas(64) float a[kLanes], b[kLanes];
  x.Store(a), y.Store(b);
  for (int i = 0; i < kLanes; ++i) a[i] = f(a[i], b[i]);
  return VF::Load(a);
}
inline VF erf(VF x) { return PerLane(x, x, [](float a, float) { return std::erf(a); }); }
inline VF erfc(VF x) { return PerLane(x, x, [](float a, float) { return std::erfc(a); }); }
inline VF pow(VF x, VF y) { return PerLane(x, y, [](float a, float b) { return std::pow(a, b); }); }
inline VF exp(VF x) { return PerLane(x, x, [](float a, float) { return std::exp(a); }); }
inline VF exp_fast(VF x) { return exp(x); }
inline VF exp_softmax(VF x) { return exp(x); }
inline VF expm1(VF x) { return PerLane(x, x, [](float a, float) { return std::expm1(a); }); }
inline VF log(VF x) { return PerLane(x, x, [](float a, float) { return std::log(a); }); }
inline VF log1p(VF x) { return PerLane(x, x, [](float a, float) { return std::log1p(a); }); }
inline VF tanh(VF x) { return PerLane(x, x, [](float a, float) { return std::tanh(a); }); }
inline VF cos(VF x) { return PerLane(x, x, [](float a, float) { return std::cos(a); }); }
inline VF sin(VF x) { return PerLane(x, x, [](float a, float) { return std::sin(a); }); }
inline VF tan(VF x) { return PerLane(x, x, [](float a, float) { return std::tan(a); }); }
inline VF asin(VF x) { return PerLane(x, x, [](float a, float) { return std::asin(a); }); }
inline VF acos(VF x) { return PerLane(x, x, [](float a, float) { return std::acos(a); }); }
inline VF atan(VF x) { return PerLane(x, x, [](float a, float) { return std::atan(a); }); }
inline VF sinh(VF x) { return PerLane(x, x, [](float a, float) { return std::sinh(a); }); }
inline VF cosh(VF x) { return PerLane(x, x, [](float a, float) { return std::cosh(a); }); }
inline VF asinh(VF x) { return PerLane(x, x, [](float a, float) { return std::asinh(a); }); }
inline VF acosh(VF x) { return PerLane(x, x, [](float a, float) { return std::acosh(a); }); }
inline VF atanh(VF x) { return PerLane(x, x, [](float a, float) { return std::atanh(a); }); }
}  // namespace graphfuse::simd
#endif

namespace graphfuse::simd {
// Rounds each lane to f16 / bf16 precision (nearest even) when a.to says so.
inline VF round_to(VF x, const OpAttrs& a) {
  if (a.to == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(DF(), hn::DemoteTo(dh, x.v));
  }
  if (a.to == DType::kBF16) {
    const hn::RebindToUnsigned<DF> du;
    const auto bits = hn::BitCast(du, x.v);
    const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    const auto rounded = hn::And(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)), hn::Set(du, 0xFFFF0000u));
    return hn::IfThenElse(hn::IsNaN(x.v), x.v, hn::BitCast(DF(), rounded));
  }
  return x;
}

// Horizontal reductions for row kernels (softmax, norms). A tree over the lanes (log2(kLanes)
// dependent steps rather than kLanes), which matters on rows of a few vectors.
// The largest lane, or NaN when any lane is NaN.
inline float MaxOfLanesNaN(VF x) {
  if (!hn::AllFalse(DF(), hn::IsNaN(x.v))) return __builtin_nanf("");
  return hn::GetLane(hn::MaxOfLanes(DF(), x.v));
}
// The sum of the lanes in double, added pairwise (lane l + lane l + kLanes/2, and so on).
// On AVX-512 and AVX2 the same tree runs as vector adds (16 -> 8 -> 4 -> 2 -> 1 doubles, or
// 8 -> 4 -> 2 -> 1; same pairs, same order, so the same bits) rather than lane by lane: every
// softmax row takes one.
inline double SumOfLanesF64(VF x) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const __m512 f = x.v.raw;
  const __m512d s8 = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)),
                                   _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))));
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  const __m256 f = x.v.raw;
  const __m256d s4 = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
#else
  alignas(64) float lanes[kLanes];
  x.Store(lanes);
  double t[kLanes];
  for (int l = 0; l < kLanes; ++l) t[l] = lanes[l];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) t[l] += t[l + w];
  return t[0];
#endif
}

// x[0, n) *= c, vectors then the tail lane by lane (the bits of a Mul by c).
inline void ScaleRow(float* x, int64_t n, float c) {
  const VF vc(c);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) (VF::Load(x + i) * vc).Store(x + i);
  for (; i < n; ++i) x[i] *= c;
}

// Lanes idx .. idx+kLanes-1 of Dropout: kept lanes scaled by 1/(1-p), dropped lanes x*0.
inline VF dropout(VF x, const OpAttrs& a, int64_t idx) {
  if (!a.training) return x;
  alignas(64) float keep[kLanes];
  const uint32_t threshold = DropoutThreshold(a.alpha);
  for (int i = 0; i < kLanes;) {
    const uint64_t e = static_cast<uint64_t>(idx + i);
    if ((e & 3) == 0 && i + 4 <= kLanes) {  // a whole Philox block: four lanes from one call
      const PhiloxWords b = PhiloxBlock(a.seed, e >> 2);
      for (int j = 0; j < 4; ++j) keep[i + j] = (b.w[j] >> 8) >= threshold ? 1.f : 0.f;
      i += 4;
    } else {
      keep[i] = (PhiloxBits(a.seed, e) >> 8) >= threshold ? 1.f : 0.f;
      ++i;
    }
  }
  return select(VF::Load(keep), x * VF(DropoutScale(a.alpha)), x * VF(0.0));
}
}  // namespace graphfuse::simd
