// FusedAttention: softmax(scale * Q K^T + mask_scale * mask) V for every (batch, head) pair in
// ONE launch, formed by the FuseAttention pass (src/passes/fuse_attention.cc). A bool mask
// selects instead (mask_select, attention_layout.h): scores where it keeps them, mask_fill elsewhere.
//
// Operands are read where they lie, through a per-operand layout attribute:
//   "bshd": the pre-head-split tensor [B,S,H*d] (any shape with that row-major order); head
//           (b, h) starts at b*S*H*d + h*d and its rows are H*d apart.
//   "bhsd": a head-split tensor [B,H,S,d]; head (b, h) is a contiguous [S,d] block.
//   "bhds": (K only) K^T already laid out [B,H,d,Sk]; head (b, h) is a contiguous [d,Sk] block.
// The output is written in "bshd" ([B,S,H*dv], what Transpose+Reshape of the heads gives) or
// "bhsd" ([B,H,S,dv]) order. Optional inputs follow q, k, v in this order: mask (when
// has_mask; broadcast to [B,H,S,Sk]), cos and sin (when rope_q or rope_k; broadcast to
// [B,H,S,d], last dim d), y = x*cos + rotate_half(x)*sin applied to Q / K rows as they are
// gathered.
//
// Per task: a block of query rows of one head. scores = scale * Q K^T is one sgemm into
// per-thread scratch ([rows, Sk]; Q and K are read in place unless RoPE needs a gathered copy;
// the projected form ropes its scratch's Q and K in place),
// the mask is added and each row exponentiated after subtracting its max (as softmax.cc does),
// then O = P V is one sgemm reading V in place and writing O in place in the output layout;
// O's rows are divided by their softmax sums last ([rows, dv] values rather than [rows, Sk];
// P's rows before the product when Sk < dv).
// No [B,H,S,Sk] tensor and no transposed copy ever exists in memory. The keys a constant mask
// drops from every row of a block (a causal mask's future) are left out of both products when
// nothing there can reach the output (KeyTailSkippable, MaskExpRow).
//
// OpenBLAS is kept single-threaded (as in gemm.cc): the (batch, head, row block) tasks are what
// is split over graphfuse's pool.
// The CPU kernel; the attributes' reading and the inference are in src/ir/schemas/attention.cc.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/simd.h"
#include "ir/schemas/attention_layout.h"
#include "kernel_lists.h"
#include "kernel_util.h"
#include "norm_rows.h"
#include "packed_gemm.h"
#include "softmax_row.h"
#include "rope_row.h"

namespace graphfuse::kernels {
namespace {

using schemas::Access;
using schemas::Dims;
using schemas::HeadAccess;
using schemas::Layout;
using schemas::ReadDims;

using simd::kLanes;
using simd::VF;

// dst[r] = rope(src row r) for `rows` rows; cos/sin rows are located through broadcast strides
// (c_row: element stride between rows; the last dim is contiguous).
void GatherRope(const float* src, int64_t src_stride, int64_t rows, int64_t d, const float* cos, const float* sin,
                int64_t c_row, float* dst) {
  for (int64_t r = 0; r < rows; ++r) RopeRow(src + r * src_stride, cos + r * c_row, sin + r * c_row, d, dst + r * d);
}

// row += mask_scale * mask (mask contiguous, or one value broadcast when mask_stride is 0), in
// the same pass that finds the row's max; then row = exp(row - max(row)); returns the sum of the
// exponentials. Vectors whose every lane lies more than 104 below the max (a causal or padding
// mask's keys, -inf or -1e9) store zeros without calling exp: below -104, exp is +0 both in the
// correctly rounded result (e^-104 is under half the smallest subnormal) and in simd::exp_softmax
// (tests/kernels_test.cc checks it). NaN lanes compare false and take the exp path.
//
// Keys [live, n) are known to have mask_scale * mask <= skip_bound (a causal row's future keys,
// padding; MaskRows below). The keys before them are done first; then if the largest score after
// them, plus skip_bound, still lies 1000 below the max so far, each of those keys would add
// nothing and change no max: score + mask - max < -1000 gives exp = +0 (and the lane sums see
// the same values in the same order: exp's +0 for skipped lanes of a shared vector, nothing
// for whole skipped vectors, which added +0 before). They are set to 0 without adding the mask
// to them or taking their max a second time. A NaN or inf among their scores fails the test,
// and the row is done whole, as before (NaN stays NaN).
//
// A bool mask (sel): a key keeps its score where the mask is true (keep_true; false
// otherwise) and takes `fill` in the others (Where(bm, scores, fill) / Where(bm, fill, scores):
// a NaN or inf score at a masked key is replaced, not propagated), before the f32 mask is added
// (first) or after. MaskRows then describe the bool mask: keys [live, n) all hold fill (the
// bool mask alone, or applied after the f32 one), so they are left out when fill lies 1000 below
// the max so far; with the Where first, they hold fill + mask, and the largest of those must.
//
// Keys [0, zeros) are known to have mask_scale * mask == 0 (+0 or -0: a causal row's past keys),
// so the mask is not added to their whole vectors: only their max is taken. x + 0 is x but for
// x = -0, which gives +0, and a zero's sign changes neither the max's value nor any exp
// (exp(-0 - m) == exp(+0 - m), and x - (+/-0) differ only in a zero's sign), so the row's
// results keep their bits.
//
// Keys [computed, n) (computed >= live) may be missing from the row altogether: their scores
// were never computed (run_block leaves a constant mask's dropped keys out of the Q K^T and P V
// products), and score_bound bounds their magnitude. They are left out as above when the bound
// allows it; otherwise the row returns -1 and the caller computes the whole row block again.
struct SelectMask {
  const uint8_t* m = nullptr;  // the row's mask values
  int64_t stride = 1;          // 1, or 0 when one value covers the row
  bool keep_true = true, first = false;
  float fill = 0;
};
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

// Whether keys [kend, Sk), which the constant mask drops from every row of a block, can be left
// out of the block's Q K^T and P V products. Their rows of V must be finite: a zero weight times
// inf or NaN is NaN in P V over every key. Under an f32 mask (not rows_of_bool) their scores
// count too (MaskExpRow compares them with the row's max): score_bound receives a bound on
// their magnitude, |scale| * sum_j max_r |q_rj| * max_k |k_kj| (1% over, for the product's
// rounding), which must be finite. Under a bool mask a dropped key holds the fill whatever its
// score, as Where gives it.
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

// A constant mask's rows (over its last dim, Sk; after mask_scale), prepared once: keys from
// live[r] on all have mask <= kSkippable, and bound[r] is the largest mask there; an f32 mask's
// keys before zeros[r] all have mask +0 or -0. MaskExpRow uses them to leave those keys out
// when the scores allow it, and to skip adding the zeros. With two masks they describe the bool
// one (keys from live[r] on take the fill), when it is constant (RowsMaskIndex).
struct MaskRows {
  static constexpr float kSkippable = -1e4f;
  int64_t sk = 0, numel = 0;
  std::vector<int64_t> live;
  std::vector<float> bound;
  std::vector<int64_t> zeros;  // f32 masks only
};

// What a plan prepares once: the constant mask's rows, and for the projected form each
// head's q, k and v columns of W gathered into one [K, 3d] matrix and packed (packed_gemm.h).
struct AttentionState {
  std::optional<MaskRows> mask;
  std::vector<std::shared_ptr<const PackedGemm>> heads;  // projected form, per group of heads:
                                                          // [S, K] @ [K, 3d*G], m = S
  int64_t rows = 0;                                       // S, the m the heads were packed for
};

// Heads per task of the projected form. When one head's weights ([K, 3d]) are larger than
// half of L2, every GEMM call streams them through the caches and RoPE then reads cold data
// (LLaMA-7B, 6 MB a head: RoPE of one head's Q took 3.3 us on a first pass, 1.3 us on a
// second; on a Zen 1 machine a probe that read half of each table row ran no faster, so the
// cold data there is the Q/K the GEMM wrote, not the cos/sin tables). A task then projects G
// heads in one call and ropes them back to back: LLaMA-7B's time outside GEMMs went from
// 1.78-2.29x to 2.26-2.62x on an AVX-512 machine (2 MiB of L2). G divides H, leaves at least
// four tasks per batch, and keeps the task's [S, 3d*G] within an eighth of L2: 256 KiB there.
// On a Zen 1 core (512 KiB of L2) a wide group made the GEMM itself slower: LLaMA-7B at S = 32,
// the attention kernel took 22-25 ms with G = 1, 24-26 with 2, 29-32 with 4 and 43-44 with 8,
// its time outside BLAS alike; there an eighth of L2 (64 KiB) gives G = 1 at S = 32, and
// decode (S = 1, where G = 8 took 8.4-9.1 ms against 10.8-11.6 with G = 1) keeps G = 8.
// Smaller weights keep one head per task: llama-small's (384 KB) with two heads a task
// measured no better (attention's BLAS share 93.4-95.0% against 93.6-93.8%).
int64_t HeadGroup(const Dims& d, int64_t k) {
  if (k * 3 * d.d * 4 <= (1 << 20)) return 1;
  int64_t g = 1;
  for (int64_t c = 2; c <= d.h / 4; ++c)
    if (d.h % c == 0 && d.s * 3 * d.d * c * 4 <= L2Bytes() / 8) g = c;
  return g;
}

// The column of W where head `head`'s third t (0 q, 1 k, 2 v) begins: W is [K, 3*H*d], its
// thirds ordered by qkv_split.
int64_t ProjColumn(const Dims& d, int t, int64_t head) { return d.proj_split[t] * d.h * d.d + head * d.d; }

// The input whose rows MaskRows describe: the bool mask when there is one, else the f32 mask.
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

Result<std::shared_ptr<const void>> PrepareAttention(const Node& node) {
  GF_ASSIGN_OR_RETURN(Dims d, ReadDims(node.attrs(), node.Describe()));
  auto state = std::make_shared<AttentionState>();
  state->mask = PrepareMaskRows(node, d);
  const Value* w = d.proj && node.inputs().size() > 1 ? node.input(1) : nullptr;
  if (w && w->constant() && w->dtype() == DType::kF32 && w->shape().size() == 2 && d.s > 0 && d.d > 0 &&
      w->shape()[0] > 0 && w->shape()[1] == 3 * d.h * d.d) {
    const int64_t k = w->shape()[0], ldw = 3 * d.h * d.d, group = HeadGroup(d, k), wg = 3 * d.d * group;
    const float* wp = w->constant()->data_as<float>();
    std::vector<float> cols(static_cast<size_t>(k * wg));  // head by head: q, k, v columns
    for (int64_t h0 = 0; h0 < d.h; h0 += group) {
      for (int64_t r = 0; r < k; ++r)
        for (int64_t g = 0; g < group; ++g)
          for (int t = 0; t < 3; ++t)
            std::memcpy(cols.data() + r * wg + g * 3 * d.d + t * d.d, wp + r * ldw + ProjColumn(d, t, h0 + g),
                        static_cast<size_t>(d.d) * sizeof(float));
      // One block of all the group's columns: LLaMA-7B's heads (M = 32, K = 4096, 384 columns)
      // took 26 ms in blocks of 64 columns against 20-21.5 ms in one (the separate QKV GEMM:
      // 22-23 ms).
      GF_ASSIGN_OR_RETURN(auto packed,
                          PackedGemm::Create(d.s, k, wg, cols.data(), wg, wg, {}, wg));
      state->heads.push_back(std::move(packed));
    }
    state->rows = d.s;
  }
  if (!state->mask && state->heads.empty()) return std::shared_ptr<const void>();
  return std::shared_ptr<const void>(std::move(state));
}

void SingleThreadedBlas() {
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

Status AttentionKernel(const KernelContext& ctx) {
  const std::string where = KernelWhere(ctx);
  GF_ASSIGN_OR_RETURN(Dims d, ReadDims(ctx.node.attrs(), where));
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : ctx.inputs) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_RETURN_IF_ERROR(schemas::CheckAttentionOperands(d, dtypes, shapes, where));
  if (ctx.outputs[0].shape != d.out_shape || ctx.outputs[0].dtype != DType::kF32)
    return InvalidArgument(where, ": output buffer ", TypeStr(ctx.outputs[0]), " is not f32",
                           ShapeToString(d.out_shape));
  for (int64_t x : {d.s, d.sk, d.d, d.dv, d.h * d.d, d.h * d.dv})
    if (x > INT_MAX) return Unimplemented(where, ": a GEMM dimension of ", x, " exceeds the BLAS int range");
  float* out = ctx.outputs[0].as<float>();
  if (d.b * d.h * d.s * d.dv == 0) return Status::Ok();
  if (d.sk == 0) {  // softmax over zero keys is empty: P V sums nothing
    std::fill(out, out + d.b * d.h * d.s * d.dv, 0.f);
    return Status::Ok();
  }
  SingleThreadedBlas();
  const float scale = ctx.node.GetFloat("scale", 1.f);
  const float mask_scale = ctx.node.GetFloat("mask_scale", 1.f);
  // The projected form reads x and W where q, k and v would be (they are null then).
  const float* q = d.proj ? nullptr : ctx.inputs[0].as<const float>();
  const float* k = d.proj ? nullptr : ctx.inputs[1].as<const float>();
  const float* v = d.proj ? nullptr : ctx.inputs[2].as<const float>();
  size_t next = static_cast<size_t>(d.first_extra());
  const float* mask = nullptr;
  std::vector<int64_t> ms;  // mask strides over [B,H,S,Sk]
  if (d.mask) {
    mask = ctx.inputs[next].as<const float>();
    ms = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.sk});
    ++next;
  }
  const uint8_t* bmask = nullptr;  // the bool mask that selects
  std::vector<int64_t> bms;
  if (d.mask_select != 0) {
    bmask = static_cast<const uint8_t*>(ctx.inputs[next].data);
    bms = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.sk});
    ++next;
  }
  // The mask's rows as prepared (a constant mask over the keys), when they are this mask's.
  const auto* state = static_cast<const AttentionState*>(ctx.state);
  const MaskRows* mask_rows = state && state->mask ? &*state->mask : nullptr;
  const bool rows_of_bool = d.mask_select != 0;  // else of the f32 mask
  const std::vector<int64_t>& prepared_strides = rows_of_bool ? bms : ms;
  const size_t prepared_index = RowsMaskIndex(d);
  if (mask_rows && (prepared_strides.empty() || prepared_strides[3] != 1 || mask_rows->sk != d.sk ||
                    mask_rows->numel != ctx.inputs[prepared_index].numel()))
    mask_rows = nullptr;
  const float *cos = nullptr, *sin = nullptr;
  std::vector<int64_t> cq, ck;  // cos/sin strides over [B,H,S,d] and [B,H,Sk,d]
  if (d.rope_q || d.rope_k) {
    cos = ctx.inputs[next].as<const float>();
    sin = ctx.inputs[next + 1].as<const float>();
    if (ctx.inputs[next].shape != ctx.inputs[next + 1].shape)
      return InvalidArgument(where, ": cos ", ShapeToString(ctx.inputs[next].shape), " and sin ",
                             ShapeToString(ctx.inputs[next + 1].shape), " differ in shape");
    cq = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.d});
    ck = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.sk, d.d});
  }
  const HeadAccess qa = Access(d.q, d, d.s, d.d), ka = Access(d.k, d, d.sk, d.d), va = Access(d.v, d, d.sk, d.dv),
                   oa = Access(d.out, d, d.s, d.dv);

  // Query rows per task: a [rows, Sk] score block of about 256 KiB (L2-resident), 16..256 rows.
  // Measured at H=32, S=Sk=512, d=128 on one core: 154 ms with 256 KiB blocks, 203 ms with
  // 64 KiB (sgemm with M=32 runs well below its M=128 rate).
  // With a constant mask (MaskRows can describe it) that fits in one such block, two blocks:
  // the first leaves out the keys its rows all drop (a causal mask's later half). llama-small
  // (S = 128): attention 3.72-3.74 ms -> 3.53 ms, the fused block 12.5 -> 12.3 ms. The blocks
  // follow from the node alone, prepared or not: the same blocks give the same bits.
  const Value* prepared_input = ctx.node.inputs().size() > prepared_index ? ctx.node.input(prepared_index) : nullptr;
  const bool constant_mask = (d.mask || d.mask_select != 0) && prepared_input && prepared_input->constant();
  const int64_t base_rows = std::min<int64_t>(d.s, std::clamp<int64_t>(65536 / std::max<int64_t>(d.sk, 1), 16, 256));
  const int64_t rows_per_block = constant_mask && d.s >= 64 ? std::min(base_rows, (d.s / 2 + 15) / 16 * 16) : base_rows;
  const int64_t blocks = (d.s + rows_per_block - 1) / rows_per_block;
  const int64_t items = d.b * d.h * blocks;
  auto align16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  const int64_t scores_floats = align16(rows_per_block * d.sk);
  const int64_t qg_floats = d.rope_q && !d.proj ? align16(rows_per_block * d.d) : 0;  // gathered copies
  const int64_t kg_floats = d.rope_k && !d.proj ? align16(d.sk * d.d) : 0;
  const int64_t kx = d.proj ? ctx.inputs[0].shape.back() : 0;  // the projection's K
  const int64_t group = d.proj ? HeadGroup(d, kx) : 1, wg = 3 * d.d * group;
  const int64_t qkv_floats = d.proj ? align16(d.s * wg) : 0;  // the projected form's heads
  const size_t scratch_bytes =
      static_cast<size_t>(scores_floats + qg_floats + kg_floats + qkv_floats + 16) * sizeof(float);
  const int64_t work_per_item = rows_per_block * d.sk * (d.d + d.dv) / 4 + rows_per_block * d.sk * 8 +
                                (d.proj ? rows_per_block * 3 * d.d * kx / 4 : 0);

  // One block of query rows of one head; the head's q, k and v rows start at qb, kb, vb and lie
  // lq, lk, lv floats apart. gathered_head names the head whose roped K is in the scratch.
  // roped: q and k hold their RoPE already (the projected form ropes them in place).
  auto run_block = [&](int64_t head, int64_t blk, const float* qb, int64_t lq, const float* kb, int64_t lk,
                       const float* vb, int64_t lv, float* scratch, int64_t& gathered_head, bool roped) {
    float* scores = scratch;
    float* qg = scratch + scores_floats;
    float* kg = qg + qg_floats;
    const int64_t b = head / d.h, h = head % d.h;
    const int64_t r0 = blk * rows_per_block, rows = std::min(rows_per_block, d.s - r0);
    const float* qh = qb + r0 * lq;
    const float* kh = kb;
    const float* vh = vb;
    float* oh = out + b * oa.head_stride_b + h * oa.head_stride_h + r0 * oa.row_stride;
    const float* a_ptr = qh;
    int64_t lda = lq;
    if (d.rope_q && !roped) {
      const int64_t off = b * cq[0] + h * cq[1] + r0 * cq[2];
      GatherRope(qh, lq, rows, d.d, cos + off, sin + off, cq[2], qg);
      a_ptr = qg;
      lda = d.d;
    }
    const float* b_ptr = kh;
    int64_t ldb = lk;
    if (d.rope_k && !roped) {
      if (gathered_head != head) {
        const int64_t off = b * ck[0] + h * ck[1];
        GatherRope(kh, lk, d.sk, d.d, cos + off, sin + off, ck[2], kg);
        gathered_head = head;
      }
      b_ptr = kg;
      ldb = d.d;
    }
    // The keys every row of the block drops through the constant mask (MaskRows): [kend, Sk)
    // is left out of both products when nothing there can reach the output (KeyTailSkippable);
    // a row whose live scores turn out too small for that (MaskExpRow returns -1) has the whole
    // block computed again with every key.
    auto mask_off = [&](int64_t r) { return mask ? b * ms[0] + h * ms[1] + (r0 + r) * ms[2] : int64_t{0}; };
    auto bool_off = [&](int64_t r) { return bmask ? b * bms[0] + h * bms[1] + (r0 + r) * bms[2] : int64_t{0}; };
    auto prepared_row = [&](int64_t r) {  // row r's row of MaskRows
      return static_cast<size_t>((rows_of_bool ? bool_off(r) : mask_off(r)) / d.sk);
    };
    int64_t kend = d.sk;
    double score_bound = 0;
    if (mask_rows) {
      int64_t top = 0;
      for (int64_t r = 0; r < rows; ++r) top = std::max(top, mask_rows->live[prepared_row(r)]);
      top = std::min(d.sk, (top + kLanes - 1) / kLanes * kLanes);
      if (top < d.sk &&
          KeyTailSkippable(d, rows_of_bool, std::abs(scale), a_ptr, lda, rows, b_ptr, ldb, vh, lv, top, score_bound))
        kend = top;
    }
    float inv[256];
    for (;;) {
      // scores[rows, kend] = scale * Q K^T (K^T read as given for bhds), rows Sk apart.
      if (d.d > 0) {
        const ScopedNs blas_time(BlasCounter(ctx.cpu));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, d.k == Layout::kBHDS ? CblasNoTrans : CblasTrans,
                    static_cast<int>(rows), static_cast<int>(kend), static_cast<int>(d.d), scale, a_ptr,
                    static_cast<int>(std::max<int64_t>(lda, 1)), b_ptr, static_cast<int>(std::max<int64_t>(ldb, 1)),
                    0.f, scores, static_cast<int>(d.sk));
      } else {
        for (int64_t r = 0; r < rows; ++r) std::fill(scores + r * d.sk, scores + r * d.sk + kend, 0.f);
      }
      bool whole = true;
      for (int64_t r = 0; r < rows && whole; ++r) {
        const int64_t moff = mask_off(r), boff = bool_off(r);
        const size_t mrow = prepared_row(r);
        const int64_t live = mask_rows ? mask_rows->live[mrow] : d.sk;
        const float bound = mask_rows ? mask_rows->bound[mrow] : 0.f;
        const int64_t zeros = mask_rows && !rows_of_bool ? mask_rows->zeros[mrow] : 0;
        const SelectMask sel{bmask + boff, bmask ? bms[3] : 1, d.mask_select > 0, d.select_first, d.mask_fill};
        const double sum = MaskExpRow(scores + r * d.sk, d.sk, mask ? mask + moff : nullptr, mask ? ms[3] : 1,
                                      mask_scale, zeros, live, bound, bmask ? &sel : nullptr, kend, score_bound);
        whole = sum != -1.0;  // (a NaN row returns NaN)
        inv[r] = static_cast<float>(1.0 / sum);
      }
      if (whole || kend == d.sk) break;
      kend = d.sk;
    }
    // O[rows, dv] = P V, written in place in the output layout. The rows are normalized on the
    // smaller side: P's [rows, kend] before the product when Sk < dv (decode, and LLaMA-7B's
    // 128-wide heads at S = 32: a quarter of the multiplies there), else O's [rows, dv] after it.
    // The choice follows from the node's shapes, so prepared and unprepared runs agree.
    auto scale_rows = [&](float* x, int64_t ld, int64_t n) {
      for (int64_t r = 0; r < rows; ++r) simd::ScaleRow(x + r * ld, n, inv[r]);
    };
    const bool normalize_p = d.sk < d.dv;
    if (normalize_p) scale_rows(scores, d.sk, kend);
    if (d.dv > 0) {
      {
        const ScopedNs blas_time(BlasCounter(ctx.cpu));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(d.dv),
                    static_cast<int>(kend), 1.f, scores, static_cast<int>(d.sk), vh,
                    static_cast<int>(std::max<int64_t>(lv, 1)), 0.f, oh,
                    static_cast<int>(std::max<int64_t>(oa.row_stride, 1)));
      }
      if (!normalize_p) scale_rows(oh, oa.row_stride, d.dv);
    }
  };

  auto run_items = [&](int64_t begin, int64_t end, float* scratch) {
    int64_t gathered_head = -1;
    for (int64_t item = begin; item < end; ++item) {
      const ScopedNs task_time(TaskCounter(ctx.cpu));
      const int64_t head = item / blocks, blk = item % blocks;
      const int64_t b = head / d.h, h = head % d.h;
      run_block(head, blk, q + b * qa.head_stride_b + h * qa.head_stride_h, qa.row_stride,
                k + b * ka.head_stride_b + h * ka.head_stride_h, ka.row_stride,
                v + b * va.head_stride_b + h * va.head_stride_h, va.row_stride, scratch, gathered_head, false);
    }
  };

  // The projected form: a task is a group of heads (HeadGroup). Their q, k and v ([S, 3d*G]:
  // x's rows of its batch times the heads' columns of W) are computed into the task's scratch,
  // where RoPE, the scores and P V then read them: they never go to memory, nor to another core.
  const float* x = d.proj ? ctx.inputs[0].as<const float>() : nullptr;
  std::vector<float> inv_rms_store;
  const float* inv_rms = nullptr;  // set below, before any task runs
  const float* w = d.proj ? ctx.inputs[1].as<const float>() : nullptr;
  const int64_t tasks = d.b * d.h / group;
  const bool packed_heads =
      d.proj && state && static_cast<int64_t>(state->heads.size()) == d.h / group && state->rows == d.s;
  auto run_projected_heads = [&](int64_t task, float* scratch) {  // heads [h0, h0 + group) of batch b
    const ScopedNs task_time(TaskCounter(ctx.cpu));
    const int64_t b = task / (d.h / group), h0 = task % (d.h / group) * group;
    float* qkv = scratch + scores_floats + qg_floats + kg_floats;
    const float* xb = x + b * d.s * kx;
    {
      const ScopedNs blas_time(BlasCounter(ctx.cpu));
      if (packed_heads) {
        const PackedGemm& g = *state->heads[static_cast<size_t>(h0 / group)];
        for (int64_t blk = 0; blk < g.blocks(); ++blk) g.RunBlock(blk, xb, qkv);
      } else if (kx == 0) {
        std::fill(qkv, qkv + d.s * wg, 0.f);
      } else {
        for (int64_t g = 0; g < group; ++g)
          for (int t = 0; t < 3; ++t)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(d.s), static_cast<int>(d.d),
                        static_cast<int>(kx), 1.f, xb, static_cast<int>(kx), w + ProjColumn(d, t, h0 + g),
                        static_cast<int>(3 * d.h * d.d), 0.f, qkv + g * 3 * d.d + t * d.d, static_cast<int>(wg));
      }
    }
    // RoPE in place, row by row through the scratch (each row holds the group's q, k and v
    // side by side): one sequential sweep over what the GEMM just wrote, rather than a strided
    // gather per head into a copy. A folded RMSNorm scales each row of q, k and v by its row's
    // 1/rms in the same sweep (x W' = y W / (1/rms)), q and k inside RoPE.
    if (d.rope_q || d.rope_k || inv_rms) {
      for (int64_t r = 0; r < d.s; ++r) {
        float* row = qkv + r * wg;
        const float c = inv_rms ? inv_rms[b * d.s + r] : 1.f;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = h0 + g;
          float* qr = row + g * 3 * d.d;
          for (int t = 0; t < 2; ++t) {  // q, then k
            float* x = qr + t * d.d;
            const bool rope = t == 0 ? d.rope_q : d.rope_k;
            const std::vector<int64_t>& cs = t == 0 ? cq : ck;
            const int64_t off = rope ? b * cs[0] + h * cs[1] + r * cs[2] : 0;
            if (rope && inv_rms) RopeRowScaled(x, cos + off, sin + off, d.d, x, c);
            else if (rope) RopeRow(x, cos + off, sin + off, d.d, x);
            else if (inv_rms) simd::ScaleRow(x, d.d, c);
          }
          if (inv_rms) simd::ScaleRow(qr + 2 * d.d, d.d, c);  // v
        }
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* hq = qkv + g * 3 * d.d;
      int64_t gathered_head = -1;
      for (int64_t blk = 0; blk < blocks; ++blk)
        run_block(b * d.h + h0 + g, blk, hq, wg, hq + d.d, wg, hq + 2 * d.d, wg, scratch, gathered_head, true);
    }
  };

  const int threads = static_cast<int>(std::min<int64_t>(ctx.cpu.ThreadsFor(items * work_per_item),
                                                         d.proj ? tasks : items));
  // A folded RMSNorm's 1/rms per row of x, as RMSNorm computes it (norm_rows.h), before the
  // heads (every task reads every row).
  if (d.proj && d.rms_eps >= 0) {
    inv_rms_store.resize(static_cast<size_t>(d.b * d.s));
    auto row_inv = [&](int64_t r) {
      inv_rms_store[static_cast<size_t>(r)] = InvRms(RowSumSquaresD(x + r * kx, kx), std::max<int64_t>(kx, 1), d.rms_eps);
    };
    const int64_t rows = d.b * d.s;
    if (ctx.cpu.pool == nullptr || threads <= 1) {
      for (int64_t r = 0; r < rows; ++r) row_inv(r);
    } else {  // a few claims per thread: a claim per row cost more than the row's sum
      const int64_t per = std::max<int64_t>(1, rows / (4 * threads)), claims = (rows + per - 1) / per;
      ForEachClaimed(ctx.cpu, threads, claims, [&](int64_t c, int) {
        const ScopedNs task_time(TaskCounter(ctx.cpu));
        for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) row_inv(r);
      });
    }
    inv_rms = inv_rms_store.data();
  }
  if (ctx.cpu.pool == nullptr || threads <= 1) {
    std::unique_ptr<float[]> local;
    float* scratch = nullptr;
    if (ctx.cpu.pool) {
      scratch = static_cast<float*>(ctx.cpu.pool->Scratch(0, scratch_bytes));
    } else {
      local.reset(new float[scratch_bytes / sizeof(float)]);
      scratch = local.get();
    }
    if (d.proj) {
      for (int64_t task = 0; task < tasks; ++task) run_projected_heads(task, scratch);
    } else {
      run_items(0, items, scratch);
    }
    return Status::Ok();
  }
  if (d.proj) {  // groups of heads claimed one at a time (a late thread takes fewer)
    ForEachClaimed(ctx.cpu, threads, tasks, [&](int64_t task, int tid) {
      run_projected_heads(task, static_cast<float*>(ctx.cpu.pool->Scratch(tid, scratch_bytes)));
    });
    return Status::Ok();
  }
  // Contiguous item ranges per task, so consecutive blocks of one head reuse its gathered K.
  ctx.cpu.pool->Parallel(threads, [&](int tid, int nt) {
    const int64_t b = items * tid / nt, e = items * (tid + 1) / nt;
    if (b < e) run_items(b, e, static_cast<float*>(ctx.cpu.pool->Scratch(tid, scratch_bytes)));
  });
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> AttentionKernels() {
  return {
      {"FusedAttention", AttentionKernel, PrepareAttention},
  };
}

}  // namespace graphfuse::kernels
