// The op-table vocabulary for scalars: T = double (the float64 reference) and T = int64_t
// (exact integer ops). The SIMD vocabulary with the same names is src/cpu/simd.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "graphfuse/ops.h"
#include "ops/philox.h"

namespace graphfuse::scalar {

template <class T>
inline T select(T c, T t, T f) { return c != T(0) ? t : f; }
template <class T>
inline T lt(T x, T y) { return x < y ? T(1) : T(0); }
template <class T>
inline T eq(T x, T y) { return x == y ? T(1) : T(0); }
template <class T>
inline T logical_and(T x, T y) { return (x != T(0) && y != T(0)) ? T(1) : T(0); }
template <class T>
inline T logical_or(T x, T y) { return (x != T(0) || y != T(0)) ? T(1) : T(0); }
template <class T>
inline T logical_not(T x) { return x == T(0) ? T(1) : T(0); }

// NaN-propagating, like numpy.maximum / minimum; x when x == y (max(0, -0) == 0).
inline double max(double x, double y) { return (x != x || y != y) ? x + y : (x < y ? y : x); }
inline double min(double x, double y) { return (x != x || y != y) ? x + y : (y < x ? y : x); }
inline int64_t max(int64_t x, int64_t y) { return x < y ? y : x; }
inline int64_t min(int64_t x, int64_t y) { return y < x ? y : x; }

inline double abs(double x) { return std::fabs(x); }
// Two's complement wraps (abs(INT64_MIN) == INT64_MIN), as numpy does; never UB.
inline int64_t abs(int64_t x) { return x < 0 ? static_cast<int64_t>(0 - static_cast<uint64_t>(x)) : x; }

inline double div(double x, double y) { return x / y; }
// Integer division truncates; x / 0 gives 0 and INT64_MIN / -1 wraps, instead of trapping.
inline int64_t div(int64_t x, int64_t y) {
  if (y == 0) return 0;
  if (y == -1) return static_cast<int64_t>(0 - static_cast<uint64_t>(x));
  return x / y;
}

// Integer power by squaring: wraps as repeated multiplication does (numpy's integer power). A
// negative exponent gives the real result truncated toward zero: 1 or -1 for x = 1 or -1, else 0
// (0 for x = 0 too, where numpy refuses and C would divide by zero).
inline int64_t pow(int64_t x, int64_t y) {
  if (y < 0) return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = static_cast<uint64_t>(x);
  for (uint64_t e = static_cast<uint64_t>(y); e != 0; e >>= 1) {
    if (e & 1) r *= b;
    b *= b;
  }
  return static_cast<int64_t>(r);
}

using std::erf;
using std::erfc;
using std::exp;
// The kernels' faster, slightly less exact exp (simd.h); the reference computes it exactly.
inline double exp_fast(double x) { return std::exp(x); }
using std::expm1;
using std::log;
using std::log1p;
using std::pow;
using std::sqrt;
using std::tanh;
using std::cos;
using std::sin;
using std::tan;
using std::asin;
using std::acos;
using std::atan;
using std::sinh;
using std::cosh;
using std::asinh;
using std::acosh;
using std::atanh;
using std::floor;
using std::ceil;
// The remainder of x / y: truncating (sign of x) when a.alpha != 0 (ONNX Mod's fmod = 1), else
// flooring (sign of y, as Python's % and numpy.mod).
inline double mod(double x, double y, const OpAttrs& a) {
  double r = std::fmod(x, y);
  if (a.alpha == 0.f && r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}
// Integers: y == 0 gives 0 and INT64_MIN % -1 gives 0, instead of trapping.
inline int64_t mod(int64_t x, int64_t y, const OpAttrs& a) {
  if (y == 0 || y == -1) return 0;
  int64_t r = x % y;
  if (a.alpha == 0.f && r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}
// Halves round to the even neighbour (ONNX Round, numpy.round): the default rounding mode.
inline double round_even(double x) { return std::nearbyint(x); }

// Rounds to the precision of a.to when that is f16 or bf16 (through f32, as the kernels do).
inline double round_to(double x, const OpAttrs& a) {
  if (a.to != DType::kF16 && a.to != DType::kBF16) return x;
  return RoundToDType(static_cast<float>(x), a.to);
}
// Integer data computes in int64; a value of a narrower type is what its store would keep:
// i32 wraps (as C and numpy narrow), bool is x != 0.
inline int64_t round_to(int64_t x, const OpAttrs& a) {
  if (a.to == DType::kI32) return static_cast<int32_t>(x);
  if (a.to == DType::kBool) return x != 0;
  return x;
}

inline double dropout(double x, const OpAttrs& a, int64_t idx) {
  if (!a.training) return x;
  return DropoutKeep(a.seed, static_cast<uint64_t>(idx), a.alpha) ? x * DropoutScale(a.alpha) : 0.0 * x;
}

}  // namespace graphfuse::scalar
