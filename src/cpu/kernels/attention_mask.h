// FusedAttention's masked softmax rows (attention.cc): the mask added or selected in the pass
// that takes the row's max, the exponentials and their sum, and the keys a constant mask drops
// from every row, which the kernel leaves out of its products when nothing there can reach the
// output.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "graphfuse/graph.h"
#include "ir/schemas/attention_layout.h"

namespace graphfuse::kernels {

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

// The input whose rows MaskRows describe: the bool mask when there is one, else the f32 mask.
size_t RowsMaskIndex(const schemas::Dims& d);

// The rows of the node's constant mask, or nothing when the mask is not constant or has no
// keys to leave out.
std::optional<MaskRows> PrepareMaskRows(const Node& node, const schemas::Dims& d);

// A bool mask that selects, as one row sees it (MaskExpRow).
struct SelectMask {
  const uint8_t* m = nullptr;  // the row's mask values
  int64_t stride = 1;          // 1, or 0 when one value covers the row
  bool keep_true = true, first = false;
  float fill = 0;
};

// row += mask_scale * mask (mask contiguous, or one value broadcast when mask_stride is 0), in
// the same pass that finds the row's max; then row = exp(row - max(row)); returns the sum of the
// exponentials. Vectors whose every lane lies more than 104 below the max (a causal or padding
// mask's keys, -inf or -1e9) store zeros without calling exp: below -104, exp is +0 both in the
// correctly rounded result (e^-104 is under half the smallest subnormal) and in simd::exp_softmax
// (tests/kernels_test.cc checks it). NaN lanes compare false and take the exp path.
//
// Keys [live, n) are known to have mask_scale * mask <= skip_bound (a causal row's future keys,
// padding; MaskRows). The keys before them are done first; then if the largest score after
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
// were never computed (RunBlock leaves a constant mask's dropped keys out of the Q K^T and P V
// products), and score_bound bounds their magnitude. They are left out as above when the bound
// allows it; otherwise the row returns -1 and the caller computes the whole row block again.
double MaskExpRow(float* row, int64_t n, const float* mask, int64_t mask_stride, float mask_scale, int64_t zeros,
                  int64_t live, float skip_bound, const SelectMask* sel, int64_t computed, double score_bound);

// Whether keys [kend, Sk), which the constant mask drops from every row of a block, can be left
// out of the block's Q K^T and P V products. Their rows of V must be finite: a zero weight times
// inf or NaN is NaN in P V over every key. Under an f32 mask (not rows_of_bool) their scores
// count too (MaskExpRow compares them with the row's max): score_bound receives a bound on
// their magnitude, |scale| * sum_j max_r |q_rj| * max_k |k_kj| (1% over, for the product's
// rounding), which must be finite. Under a bool mask a dropped key holds the fill whatever its
// score, as Where gives it.
bool KeyTailSkippable(const schemas::Dims& d, bool rows_of_bool, float abs_scale, const float* q, int64_t lq,
                      int64_t rows, const float* k, int64_t lk, const float* v, int64_t lv, int64_t kend,
                      double& score_bound);

}  // namespace graphfuse::kernels
