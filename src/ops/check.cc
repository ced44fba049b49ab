#include "ops/check.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "graphfuse/status.h"
#include "ops/reference.h"

namespace graphfuse {
namespace {

std::string Show(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

double RoundTo(double v, DType t) {
  double out = 0;
  TensorView view{t, {1}, nullptr};
  alignas(8) unsigned char buf[8];
  view.data = buf;
  StoreFromDouble(view, 0, v);
  out = LoadAsDouble(view, 0);
  return out;
}

constexpr double kMinNormalF32 = 1.1754943508222875e-38;

}  // namespace

double UlpOf(double v, DType t) {
  v = std::fabs(v);
  int mant_bits = 23, min_exp = -126;
  if (t == DType::kF16) mant_bits = 10, min_exp = -14;
  if (t == DType::kBF16) mant_bits = 7;
  int e = (v > 0 && std::isfinite(v)) ? std::ilogb(v) : min_exp;
  if (e < min_exp) e = min_exp;
  return std::ldexp(1.0, e - mant_bits);
}

CheckReport CheckAgainstReference(OpKind op, std::span<const TensorView> in, const TensorView& out,
                                  const OpAttrs& attrs, int64_t limit) {
  CheckReport rep;
  const OpInfo& info = GetOpInfo(op);
  auto ref = ReferenceOp(op, in, attrs);
  if (!ref.ok()) {
    rep.ok = false;
    rep.first_failure = ref.status().ToString();
    return rep;
  }
  std::vector<DType> dtypes;
  for (const TensorView& t : in) dtypes.push_back(t.dtype);
  const bool ints = ComputesInIntegers(op, dtypes);
  const bool exact = ints || info.max_ulp == 0;
  const DType odt = out.dtype;
  std::vector<std::vector<int64_t>> strides;
  for (const TensorView& t : in) strides.push_back(BroadcastStrides(t.shape, out.shape));
  std::vector<int64_t> index(out.shape.size(), 0);
  const int64_t n = limit < 0 ? out.numel() : std::min(limit, out.numel());
  for (int64_t i = 0; i < n; ++i) {
    const double got = LoadAsDouble(out, i);
    const double r = (*ref)[i];
    double x[3] = {0, 0, 0};
    for (size_t k = 0; k < in.size(); ++k) {
      int64_t off = 0;
      for (size_t d = 0; d < index.size(); ++d) off += index[d] * strides[k][d];
      x[k] = LoadAsDouble(in[k], off);
    }
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < out.shape[d]) break;
      index[d] = 0;
    }
    bool ok;
    std::string expect;
    if (exact) {
      const double want = RoundTo(ints ? r : static_cast<double>(static_cast<float>(r)), odt);
      ok = (std::isnan(want) && std::isnan(got)) || (want == got && std::signbit(want) == std::signbit(got));
      expect = Show(want);
    } else {
      double lo = INFINITY, hi = -INFINITY;
      bool any_nan = false;
      const int k = static_cast<int>(in.size());
      int combos = 1;
      for (int j = 0; j < k; ++j) combos *= 3;
      for (int c = 0; c < combos; ++c) {
        double px[3] = {x[0], x[1], x[2]};
        int cc = c;
        for (int j = 0; j < k; ++j, cc /= 3) {
          const float f = static_cast<float>(x[j]);
          if (!std::isfinite(f) || dtypes[j] == DType::kBool) continue;
          if (cc % 3 == 1) px[j] = std::nextafter(f, -INFINITY);
          if (cc % 3 == 2) px[j] = std::nextafter(f, INFINITY);
        }
        const double v = ReferenceScalar(op, px[0], px[1], px[2], attrs, i);
        if (std::isnan(v)) any_nan = true;
        else lo = std::min(lo, v), hi = std::max(hi, v);
      }
      if (lo > hi) {
        ok = std::isnan(got);  // every nearby input gives NaN
      } else if (std::isnan(got)) {
        ok = any_nan;
      } else {
        const double half = odt == DType::kF32 ? 0 : 0.5;
        const double lo_a = lo - info.max_ulp * UlpOf(lo, DType::kF32) - half * UlpOf(lo, odt);
        const double hi_a = hi + info.max_ulp * UlpOf(hi, DType::kF32) + half * UlpOf(hi, odt);
        // Past the dtype's range the rounded result is inf; below FLT_MIN it may flush to 0.
        const bool overflow_ok = std::isinf(got) && (RoundTo(lo, odt) == got || RoundTo(hi, odt) == got);
        const bool flush_ok = got == 0 && std::max(std::fabs(lo), std::fabs(hi)) < kMinNormalF32;
        ok = (got >= lo_a && got <= hi_a) || overflow_ok || flush_ok;
        if (std::isfinite(got) && !flush_ok) {
          const double outside = got < lo ? lo - got : (got > hi ? got - hi : 0.0);
          rep.max_contract_ulp = std::max(rep.max_contract_ulp, outside / UlpOf(got < lo ? lo : hi, DType::kF32));
        }
      }
      if (std::isfinite(r) && std::isfinite(got) && r != 0)
        rep.max_ulp_error = std::max(rep.max_ulp_error, std::fabs(got - r) / UlpOf(r, DType::kF32));
      expect = StrCat("[", Show(lo), ", ", Show(hi), "] +- ", info.max_ulp, " ulp");
    }
    ++rep.checked;
    if (!ok) {
      ++rep.failures;
      rep.ok = false;
      if (rep.first_failure.empty()) {
        std::string args;
        for (size_t j = 0; j < in.size(); ++j) args += (j ? ", " : "") + Show(x[j]);
        rep.first_failure = std::string(info.name) + "(" + args + ") at element " + std::to_string(i) + " gave " +
                            Show(got) + ", expected " + expect + " (reference " + Show(r) + ")";
      }
    }
  }
  return rep;
}

}  // namespace graphfuse
