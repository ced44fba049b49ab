#include "cpu/kernels/attention_mask.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/simd.h"
#include "cpu/kernels/softmax_row.h"

namespace graphfuse::kernels {

using schemas::Dims;
using schemas::Layout;
using simd::kLanes;
using simd::VF;

size_t RowsMaskIndex(const Dims& d) {
  return static_cast<size_t>(d.mask_select != 0 ? d.bool_mask_index() : d.first_extra());
}

std::optional<MaskRows> PrepareMaskRows(const Node& node, const Dims& d) {
  const size_t mi = RowsMaskIndex(d);
  if ((!d.mask && d.mask_select == 0) || node.inputs().size() <= mi || !node.input(mi) || !node.input(mi)->constant())
    return std::nullopt;
  const Tensor& m = *node.input(mi)->constant();
  if (m.shape().empty() || m.shape().back() != d.sk || d.sk == 0) return std::nullopt;
  MaskRows rows;
  rows.sk = d.sk;
  rows.numel = m.numel();
  if (d.mask_select != 0) {  // a bool mask: trailing keys it drops take the fill
    if (m.dtype() != DType::kBool || !(d.mask_fill <= MaskRows::kSkippable)) return std::nullopt;
    const uint8_t* p = static_cast<const uint8_t*>(m.data());
    for (int64_t r = 0; r < m.numel() / d.sk; ++r) {
      int64_t live = d.sk;
      while (live > 0 && (p[r * d.sk + live - 1] != 0) != (d.mask_select > 0)) --live;
      rows.live.push_back(live);
      rows.bound.push_back(d.mask_fill);
    }
    return rows;
  }
  if (m.dtype() != DType::kF32) return std::nullopt;
  const float scale = node.GetFloat("mask_scale", 1.f);
  const float* p = m.data_as<float>();
  for (int64_t r = 0; r < m.numel() / d.sk; ++r) {
    const float* row = p + r * d.sk;
    auto scaled = [&](int64_t k) { return scale == 1.f ? row[k] : row[k] * scale; };  // as the kernel rounds it
    int64_t live = d.sk;
    float bound = -std::numeric_limits<float>::infinity();
    while (live > 0) {
      const float v = scaled(live - 1);
      if (!(v <= MaskRows::kSkippable)) break;  // NaN stays live
      bound = std::max(bound, v);
      --live;
    }
    rows.live.push_back(live);
    rows.bound.push_back(bound);
    int64_t zeros = 0;
    while (zeros < live && scaled(zeros) == 0.f) ++zeros;
    rows.zeros.push_back(zeros);
  }
  return rows;
}

double MaskExpRow(float* row, int64_t n, const float* mask, int64_t mask_stride, float mask_scale, int64_t zeros,
                  int64_t live, float skip_bound, const SelectMask* sel, int64_t computed, double score_bound) {
  const float ninf = -std::numeric_limits<float>::infinity();
  VF vmax(ninf);
  // row[begin, end) += what `at` gives, the max taken over whole vectors as they are stored; the
  // ragged tail is added lane by lane and joins the max padded with -inf.
  // Two running maxima, as MaxInto keeps four (softmax_row.h).
  auto add_and_max = [&](int64_t begin, int64_t end, auto vec_at, auto at) {
    int64_t i = begin;
    if (i + 2 * kLanes <= end) {
      VF vmax1(ninf);
      for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
        const VF x = VF::Load(row + i) + vec_at(i), x1 = VF::Load(row + i + kLanes) + vec_at(i + kLanes);
        x.Store(row + i);
        x1.Store(row + i + kLanes);
        vmax = simd::max(vmax, x);
        vmax1 = simd::max(vmax1, x1);
      }
      vmax = simd::max(vmax, vmax1);
    }
    for (; i + kLanes <= end; i += kLanes) {
      const VF x = VF::Load(row + i) + vec_at(i);
      x.Store(row + i);
      vmax = simd::max(vmax, x);
    }
    for (int64_t j = i; j < end; ++j) row[j] += at(j);
    if (i < end) vmax = simd::max(vmax, LoadTail(row + i, end - i, ninf));
  };
  auto select = [&](int64_t begin, int64_t end) {
    if (sel->stride == 0) {
      if ((sel->m[0] != 0) != sel->keep_true) std::fill(row + begin, row + end, sel->fill);
    } else {
      for (int64_t k = begin; k < end; ++k) row[k] = (sel->m[k] != 0) == sel->keep_true ? row[k] : sel->fill;
    }
  };
  auto scaled_mask = [&](int64_t k) {  // the f32 mask at key k, rounded as add_and_max does
    const float mk = mask[mask_stride == 0 ? 0 : k];
    return mask_scale == 1.f ? mk : mk * mask_scale;
  };
  auto add = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) row[k] += scaled_mask(k);
  };
  auto pass = [&](int64_t begin, int64_t end) {
    if (sel) {
      if (sel->first || !mask) select(begin, end);
      if (mask) add(begin, end);
      if (!sel->first && mask) select(begin, end);
      MaxInto(vmax, row + begin, end - begin);
    } else if (!mask) {
      MaxInto(vmax, row + begin, end - begin);
    } else {
      const int64_t z = std::clamp(zeros / kLanes * kLanes, begin, end);  // whole vectors of zeros
      MaxInto(vmax, row + begin, z - begin);
      if (mask_stride == 0) {
        const float m = scaled_mask(0);
        add_and_max(z, end, [&](int64_t) { return VF(m); }, [&](int64_t) { return m; });
      } else if (mask_scale == 1.f) {
        add_and_max(z, end, [&](int64_t k) { return VF::Load(mask + k); }, [&](int64_t k) { return mask[k]; });
      } else {
        const VF ms(mask_scale);
        add_and_max(z, end, [&](int64_t k) { return VF::Load(mask + k) * ms; },
                    [&](int64_t k) { return mask[k] * mask_scale; });
      }
    }
  };
  // Whole vectors only: a ragged edge would cost three lane-by-lane tails per row, and keys
  // done the usual way are always right.
  live = std::min(n, (std::max<int64_t>(live, 0) + kLanes - 1) / kLanes * kLanes);
  pass(0, live);
  if (live < n) {
    const float max_live = simd::MaxOfLanesNaN(vmax);
    // The largest value a key of [live, n) would hold. With a bool mask (MaskRows then describe
    // it) each holds the fill, or, when the Where comes before the f32 mask, fill + mask.
    double rest;
    if (sel) {
      rest = sel->fill;
      if (mask && sel->first) {
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t k = live; k < n; ++k) {
          const float v = scaled_mask(k);
          top = v > top || v != v ? v : top;  // NaN sticks
          if (top != top) break;
        }
        rest += static_cast<double>(top);
      }
    } else {
      double top = computed > live ? static_cast<double>(RowMax(row + live, computed - live))
                                   : -std::numeric_limits<double>::infinity();
      if (computed < n) top = std::max(top, score_bound);
      rest = top + static_cast<double>(skip_bound);
    }
    if (rest < static_cast<double>(max_live) - 1000.0) {
      std::fill(row + live, row + computed, 0.f);
      return ExpShiftSum(row, row, live, max_live);
    }
    if (computed < n) return -1.0;
    pass(live, n);
  }
  return ExpShiftSum(row, row, n, simd::MaxOfLanesNaN(vmax));
}

bool KeyTailSkippable(const Dims& d, bool rows_of_bool, float abs_scale, const float* q, int64_t lq, int64_t rows,
                      const float* k, int64_t lk, const float* v, int64_t lv, int64_t kend, double& score_bound) {
  const VF zero(0.f);
  VF nonfinite(0.f);  // turns NaN at any inf or NaN
  for (int64_t key = kend; key < d.sk; ++key) {
    const float* row = v + key * lv;
    int64_t j = 0;
    for (; j + kLanes <= d.dv; j += kLanes) nonfinite = nonfinite + VF::Load(row + j) * zero;
    for (; j < d.dv; ++j)
      if (!std::isfinite(row[j])) return false;
  }
  if (simd::MaxOfLanesNaN(nonfinite) != 0.f) return false;
  if (rows_of_bool) return true;
  auto amax = [](float m, float x) {
    const float a = std::fabs(x);
    return a > m || a != a ? a : m;  // NaN sticks
  };
  // m[j] = max(m[j], |x[r * ld + j]|) over rows [0, n): whole vectors of j as simd::max of
  // simd::abs (NaN sticks there too), the rest lane by lane.
  auto amax_rows = [&](std::vector<float>& m, const float* x, int64_t ld, int64_t n) {
    const int64_t whole = d.d / kLanes * kLanes;
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * ld;
      for (int64_t j = 0; j < whole; j += kLanes)
        simd::max(VF::Load(m.data() + j), simd::abs(VF::Load(xr + j))).Store(m.data() + j);
      for (int64_t j = whole; j < d.d; ++j) m[j] = amax(m[j], xr[j]);
    }
  };
  std::vector<float> qm(static_cast<size_t>(d.d), 0.f), km(static_cast<size_t>(d.d), 0.f);
  amax_rows(qm, q, lq, rows);
  if (d.k == Layout::kBHDS) {  // K^T: a row per dimension
    for (int64_t j = 0; j < d.d; ++j)
      for (int64_t key = kend; key < d.sk; ++key) km[j] = amax(km[j], k[j * lk + key]);
  } else {
    amax_rows(km, k + kend * lk, lk, d.sk - kend);
  }
  double bound = 0;
  for (int64_t j = 0; j < d.d; ++j) bound += static_cast<double>(qm[j]) * static_cast<double>(km[j]);
  score_bound = bound * static_cast<double>(abs_scale) * 1.01;
  return std::isfinite(score_bound);
}

}  // namespace graphfuse::kernels
