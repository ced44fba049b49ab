// FuseAttention: attention blocks built with the C++ API as PyTorch exports them -> one
// FusedAttention node; refusals asserted by code; the fused graph checked against the unfused
// graph, against a float64 attention computed here, and against its own "reference" graph.
#include <gtest/gtest.h>

#include "cpu/cpu_target.h"
#include "graph_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "ir/op_registry.h"
#include "ir/text.h"
#include "passes/fusion_passes.h"
#include "passes/pipeline.h"
#include "testing/blocks.h"
#include "cpu/executor.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse {
namespace {

enum class ScaleForm { kNone, kDiv, kMulRight, kMulLeft, kDivThenMul };
// kCausalBool: a constant bool mask, Where(mask, scores, -inf) (Hugging Face GPT-2's
// torch.where); kPaddingBool: a bool input, true on padded keys, Where(pad, lowest, scores)
// (masked_fill) with a factor 0.5 applied after it, so the fill is scaled too.
// kKeepNotBool: a bool input, true on kept keys, written as masked_fill(~keep, lowest), which
// exports as Where(Cast(Not(keep), bool), lowest, scores).
// kCausalBoolThenPadding: Hugging Face's GPT-2 with an attention_mask, Where(causal, s, fill)
// then + pad (an f32 input); kPaddingThenCausalBool: the two the other way round. The fill is
// -5 in both, so that the order shows: a key both dropped and padded weighs e^-5 in the
// second form and nothing in the first.
enum class MaskForm {
  kNone, kCausal, kCausal2d, kPadding, kCausalBool, kPaddingBool, kKeepNotBool, kCausalBoolThenPadding,
  kPaddingThenCausalBool
};
bool HasCausalBool(MaskForm m) {
  return m == MaskForm::kCausalBool || m == MaskForm::kCausalBoolThenPadding || m == MaskForm::kPaddingThenCausalBool;
}

struct Spec {
  int64_t b = 2, h = 4, s = 16, sk = 16, d = 32;
  ScaleForm scale = ScaleForm::kDiv;
  MaskForm mask = MaskForm::kNone;
  bool merge_heads = true;     // output Transpose + Reshape to [B,S,H*d]
  bool k_direct = false;       // K^T as Transpose(Reshape(k), perm [0,2,3,1])
  bool rope = false;           // Rope on Q and K
  bool scores_output = false;  // the raw scores are also a graph output
  bool k4_output = false;      // the head-split K is also a graph output
  bool not_output = false;     // kKeepNotBool: Not(keep) is also a graph output
  DType dtype = DType::kF32;
  float causal_value = std::numeric_limits<float>::lowest();  // kCausal / kCausal2d: the masked entries
  // kCausal / kCausal2d: the kept keys of row i from i/2 on hold -0.25*(i-j) (an ALiBi-like
  // bias), and the zeros before them alternate +0 and -0.
  bool live_bias = false;
  float dual_fill = -5;  // kCausalBoolThenPadding / kPaddingThenCausalBool: the Where's fill
};

// What the test needs to compute the attention itself.
struct Built {
  std::unique_ptr<Graph> g;
  double scale = 1;
  std::vector<float> mask;  // causal mask values [S,Sk] (constant), empty otherwise
  std::vector<float> keep;  // kCausalBool: 1 where the bool mask keeps the score [S,Sk]
  double fill = 0;          // kCausalBool / kPaddingBool: a masked score's final value
  std::vector<float> cos, sin;  // [S,d]
};

std::shared_ptr<const Tensor> Const(DType t, const Shape& shape, const std::vector<float>& v) {
  return std::make_shared<const Tensor>(Tensor::FromFloats(t, shape, v).value());
}

Value* Node1(Graph& g, const std::string& op, const std::vector<Value*>& ins, AttributeMap attrs = {}) {
  auto n = g.AddNode(op, ins, std::move(attrs));
  EXPECT_TRUE(n.ok()) << op << ": " << n.status().ToString();
  return n.ok() ? (*n)->output() : nullptr;
}

Built Build(const Spec& sp) {
  Built r;
  r.g = std::make_unique<Graph>("attention");
  Graph& g = *r.g;
  const int64_t hd = sp.h * sp.d;
  Value* q = g.AddInput("q", sp.dtype, {sp.b, sp.s, hd}).value();
  Value* k = g.AddInput("k", sp.dtype, {sp.b, sp.sk, hd}).value();
  Value* v = g.AddInput("v", sp.dtype, {sp.b, sp.sk, hd}).value();
  Value* mask = nullptr;
  if (sp.mask == MaskForm::kCausal || sp.mask == MaskForm::kCausal2d) {
    // Additive causal mask as Hugging Face writes it: 0 on and below the diagonal, float's lowest above.
    r.mask.assign(static_cast<size_t>(sp.s * sp.sk), 0.f);
    for (int64_t i = 0; i < sp.s; ++i)
      for (int64_t j = i + 1; j < sp.sk; ++j) r.mask[i * sp.sk + j] = sp.causal_value;
    if (sp.live_bias)
      for (int64_t i = 0; i < sp.s; ++i)
        for (int64_t j = 0; j <= std::min(i, sp.sk - 1); ++j)
          r.mask[i * sp.sk + j] = j >= i / 2 ? -0.25f * static_cast<float>(i - j) : (j % 2 ? -0.f : 0.f);
    const Shape ms = sp.mask == MaskForm::kCausal ? Shape{1, 1, sp.s, sp.sk} : Shape{sp.s, sp.sk};
    mask = g.AddConstant("mask", Const(sp.dtype, ms, r.mask)).value();
  } else if (sp.mask == MaskForm::kPadding) {
    mask = g.AddInput("pad", sp.dtype, {sp.b, 1, 1, sp.sk}).value();
  }
  Value* pad = nullptr;  // the f32 padding input beside a bool causal mask
  if (sp.mask == MaskForm::kCausalBoolThenPadding || sp.mask == MaskForm::kPaddingThenCausalBool)
    pad = g.AddInput("pad", sp.dtype, {sp.b, 1, 1, sp.sk}).value();
  if (HasCausalBool(sp.mask)) {
    r.keep.assign(static_cast<size_t>(sp.s * sp.sk), 0.f);
    for (int64_t i = 0; i < sp.s; ++i)
      for (int64_t j = 0; j <= std::min(i, sp.sk - 1); ++j) r.keep[i * sp.sk + j] = 1.f;
    mask = g.AddConstant("mask", Const(DType::kBool, {1, 1, sp.s, sp.sk}, r.keep)).value();
  } else if (sp.mask == MaskForm::kPaddingBool) {
    mask = g.AddInput("padb", DType::kBool, {sp.b, 1, 1, sp.sk}).value();
  } else if (sp.mask == MaskForm::kKeepNotBool) {
    mask = g.AddInput("keepb", DType::kBool, {sp.b, 1, 1, sp.sk}).value();
  }
  auto shape_of = [&](const std::string& name, int64_t rows) {
    return g.AddConstant(name, Const(DType::kI64, {4}, {float(sp.b), float(rows), float(sp.h), float(sp.d)})).value();
  };
  auto heads = [&](Value* x, Value* shape, std::vector<int64_t> perm) {
    return Node1(g, "Transpose", {Node1(g, "Reshape", {x, shape})}, {{"perm", perm}});
  };
  Value *cos = nullptr, *sin = nullptr;
  if (sp.rope) {
    for (int64_t i = 0; i < sp.s; ++i)
      for (int64_t j = 0; j < sp.d; ++j) {
        const double f = i / std::pow(10000.0, 2.0 * (j % (sp.d / 2)) / sp.d);
        r.cos.push_back(static_cast<float>(std::cos(f)));
        r.sin.push_back(static_cast<float>(std::sin(f)));
      }
    cos = g.AddConstant("cos", Const(sp.dtype, {sp.s, sp.d}, r.cos)).value();
    sin = g.AddConstant("sin", Const(sp.dtype, {sp.s, sp.d}, r.sin)).value();
  }
  Value* q4 = heads(q, shape_of("q_shape", sp.s), {0, 2, 1, 3});
  if (sp.rope) q4 = Node1(g, "Rope", {q4, cos, sin});
  Value* kt = nullptr;
  Value* k4 = nullptr;
  if (sp.k_direct) {
    kt = heads(k, shape_of("k_shape", sp.sk), {0, 2, 3, 1});
  } else {
    k4 = heads(k, shape_of("k_shape", sp.sk), {0, 2, 1, 3});
    if (sp.rope) k4 = Node1(g, "Rope", {k4, cos, sin});
    kt = Node1(g, "Transpose", {k4}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  }
  Value* v4 = heads(v, shape_of("v_shape", sp.sk), {0, 2, 1, 3});
  Value* scores = Node1(g, "MatMul", {q4, kt});
  Value* s = scores;
  const double sq = std::sqrt(static_cast<double>(sp.d));
  auto scalar = [&](const std::string& name, double c) {
    return g.AddConstant(name, Const(sp.dtype, {}, {static_cast<float>(c)})).value();
  };
  switch (sp.scale) {
    case ScaleForm::kNone: break;
    case ScaleForm::kDiv: s = Node1(g, "Div", {s, scalar("c", sq)}), r.scale = 1 / double(float(sq)); break;
    case ScaleForm::kMulRight: s = Node1(g, "Mul", {s, scalar("c", 1 / sq)}), r.scale = float(1 / sq); break;
    case ScaleForm::kMulLeft: s = Node1(g, "Mul", {scalar("c", 1 / sq), s}), r.scale = float(1 / sq); break;
    case ScaleForm::kDivThenMul:
      s = Node1(g, "Mul", {Node1(g, "Div", {s, scalar("c", 2.0)}), scalar("c2", 0.25)});
      r.scale = 0.125;
      break;
  }
  if (sp.mask == MaskForm::kCausalBool) {
    r.fill = -INFINITY;
    s = Node1(g, "Where", {mask, s, scalar("fill", r.fill)});
  } else if (sp.mask == MaskForm::kCausalBoolThenPadding) {
    r.fill = sp.dual_fill;  // -5: not far below the scores; a dropped key still weighs, unless the pad drops it
    s = Node1(g, "Add", {Node1(g, "Where", {mask, s, scalar("fill", r.fill)}), pad});
  } else if (sp.mask == MaskForm::kPaddingThenCausalBool) {
    r.fill = sp.dual_fill;  // -5: a dropped key weighs e^-5, padded or not
    s = Node1(g, "Where", {mask, Node1(g, "Add", {s, pad}), scalar("fill", r.fill)});
  } else if (sp.mask == MaskForm::kPaddingBool) {
    r.fill = 0.5 * double(std::numeric_limits<float>::lowest());
    s = Node1(g, "Mul", {Node1(g, "Where", {mask, scalar("fill", std::numeric_limits<float>::lowest()), s}), scalar("half", 0.5)});
    r.scale *= 0.5;
  } else if (sp.mask == MaskForm::kKeepNotBool) {
    r.fill = double(std::numeric_limits<float>::lowest());
    Value* dropped = Node1(g, "Cast", {Node1(g, "Not", {mask})}, {{"to", static_cast<int64_t>(DType::kBool)}});
    if (sp.not_output) {
      EXPECT_TRUE(g.MarkOutput(dropped->producer()->input(0)).ok());
    }
    s = Node1(g, "Where", {dropped, scalar("fill", r.fill), s});
  } else if (mask) {
    s = Node1(g, "Add", {s, mask});
  }
  Value* p = Node1(g, "Softmax", {s}, {{"axis", int64_t{-1}}});
  Value* o = Node1(g, "MatMul", {p, v4});
  if (sp.merge_heads) {
    o = Node1(g, "Transpose", {o}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    o = Node1(g, "Reshape", {o, g.AddConstant("o_shape", Const(DType::kI64, {3}, {float(sp.b), float(sp.s), float(hd)})).value()});
  }
  EXPECT_TRUE(g.RenameValue(o, "out").ok());
  EXPECT_TRUE(g.MarkOutput(o).ok());
  if (sp.scores_output) {
    EXPECT_TRUE(g.MarkOutput(scores).ok());
  }
  if (sp.k4_output) {
    EXPECT_TRUE(g.MarkOutput(k4).ok());
  }
  EXPECT_TRUE(g.Verify().ok()) << g.Verify().ToString();
  return r;
}

// Random non-zero inputs: q, k, v in +-[0.05, 1.5] (a fixed sign per draw), padding masks 0 or -1e4.
int Formed(const Result<int>& r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : -1;
}

bool HasRefusal(const FusionReport& r, const std::string& code) {
  for (const auto& x : r.refusals)
    if (x.code == code) return true;
  return false;
}

// Tolerance of fused vs unfused and vs float64, per element: |got - want| <= kAtol + kRtol*|want|.
// Both f32 paths use the same vector exp and sgemm; what differs is rounding order: the scale
// rides on sgemm's alpha (s*(1/c) rather than s/c), the per-head sgemm may sum the d-long dot
// products in another order than the batched MatMul, and the softmax sum divides O's rows rather
// than P's (when Sk >= dv). A score error delta becomes a relative error delta on exp(s), and the output is a convex
// combination of V (|v| <= 1.5), so |err| <~ 2 * delta * 1.5. delta is a few ulp of the largest
// score: |s| <= d * 1.5^2 / sqrt(d) ~ 13 scaled (delta ~ 3e-6 at 4 ulp), ~72 unscaled (~1.7e-5
// worst case, rounding errors of a 32-term sum rarely add up). Measured: <= 6e-7 fused vs
// unfused, <= 1.8e-6 vs float64 (the unscaled cross-attention case). 1e-5 absolute keeps a 5x
// margin and still catches a 1e-4 relative slip in the kernel (errors of 3e-5 and more).
constexpr double kAtol = 1e-5, kRtol = 1e-5;

void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.GetAsDouble(i), b = want.GetAsDouble(i), err = std::fabs(a - b);
    worst = std::max(worst, err);
    if (!(err <= kAtol + kRtol * std::fabs(b)) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << b;
  }
  EXPECT_EQ(bad, 0) << what << " (max |err| " << worst << ")";
}

// softmax(scale * Q K^T + mask) V in float64 from the raw [B,S,H*d] inputs, written in [B,S,H*d]
// order (or [B,H,S,d] without the head merge).
Tensor Float64Attention(const Spec& sp, const Built& b, const std::vector<Tensor>& ins) {
  const int64_t hd = sp.h * sp.d;
  const Tensor &Q = ins[0], &K = ins[1], &V = ins[2];
  const bool pad_input = sp.mask == MaskForm::kPadding || sp.mask == MaskForm::kCausalBoolThenPadding ||
                         sp.mask == MaskForm::kPaddingThenCausalBool;
  const Tensor* pad = pad_input ? &ins[3] : nullptr;
  const Tensor* padb = sp.mask == MaskForm::kPaddingBool ? &ins[3] : nullptr;
  const Tensor* keepb = sp.mask == MaskForm::kKeepNotBool ? &ins[3] : nullptr;
  Tensor out = Tensor::Empty(DType::kF32, sp.merge_heads ? Shape{sp.b, sp.s, hd} : Shape{sp.b, sp.h, sp.s, sp.d}).value();
  auto rope = [&](const Tensor& x, int64_t bb, int64_t row, int64_t hh, int64_t j) {
    const double xj = x.GetAsDouble((bb * (&x == &Q ? sp.s : sp.sk) + row) * hd + hh * sp.d + j);
    if (!sp.rope) return xj;
    const int64_t half = sp.d / 2;
    const int64_t jr = j < half ? j + half : j - half;
    const double xr = x.GetAsDouble((bb * (&x == &Q ? sp.s : sp.sk) + row) * hd + hh * sp.d + jr);
    return xj * b.cos[row * sp.d + j] + (j < half ? -xr : xr) * b.sin[row * sp.d + j];
  };
  std::vector<double> sc(static_cast<size_t>(sp.sk));
  for (int64_t bb = 0; bb < sp.b; ++bb)
    for (int64_t hh = 0; hh < sp.h; ++hh)
      for (int64_t i = 0; i < sp.s; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < sp.sk; ++j) {
          double dot = 0;
          for (int64_t t = 0; t < sp.d; ++t) dot += rope(Q, bb, i, hh, t) * rope(K, bb, j, hh, t);
          sc[j] = dot * b.scale;
          if (!b.mask.empty()) sc[j] += b.mask[i * sp.sk + j];
          const bool dropped = !b.keep.empty() && b.keep[i * sp.sk + j] == 0;
          if (dropped && sp.mask == MaskForm::kCausalBoolThenPadding) sc[j] = b.fill;  // Where, then the add
          if (pad) sc[j] += pad->GetAsDouble(bb * sp.sk + j);
          if (dropped && sp.mask != MaskForm::kCausalBoolThenPadding) sc[j] = b.fill;
          if (padb && padb->GetAsDouble(bb * sp.sk + j) != 0) sc[j] = b.fill;
          if (keepb && keepb->GetAsDouble(bb * sp.sk + j) == 0) sc[j] = b.fill;
          m = std::max(m, sc[j]);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - m));
        for (int64_t t = 0; t < sp.d; ++t) {
          double acc = 0;
          for (int64_t j = 0; j < sp.sk; ++j) acc += sc[j] / sum * V.GetAsDouble((bb * sp.sk + j) * hd + hh * sp.d + t);
          const int64_t o = sp.merge_heads ? (bb * sp.s + i) * hd + hh * sp.d + t : ((bb * sp.h + hh) * sp.s + i) * sp.d + t;
          out.SetFromDouble(o, acc);
        }
      }
  return out;
}

// Fuses a copy of the spec's graph and checks it: one FusedAttention and nothing else that
// launches, fused == unfused == float64, and the node's reference graph agrees.
// The FusedAttention node of `g` run once on its own, without the state its plan prepares
// (the mask's rows: MaskExpRow then does every key of every row).
Tensor RunUnprepared(const Graph& g, const std::vector<Tensor>& ins, int threads) {
  const Node* fa = FindOp(g, "FusedAttention");
  EXPECT_NE(fa, nullptr);
  if (!fa) return Tensor::Empty(DType::kF32, {0}).value();
  std::vector<TensorView> in;
  for (const Value* v : fa->inputs()) {
    if (v->constant()) in.push_back(v->constant()->view());
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i] == v) in.push_back(ins[i].view());
  }
  Tensor out = Tensor::Empty(fa->output()->dtype(), fa->output()->shape()).value();
  std::vector<TensorView> outs{out.view()};
  ThreadPool pool(threads);
  EXPECT_TRUE(RunNodeOnce(*fa, in, outs, CpuContext{&pool}).ok());
  return out;
}

// Same values, NaN matching NaN.
bool SameValues(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    if (!(std::isnan(x) && std::isnan(y)) && std::memcmp(&x, &y, sizeof x) != 0) return false;
  }
  return true;
}

FusionReport FuseAndCheck(const Spec& sp, int threads = 2, uint32_t seed = 7) {
  Built unfused = Build(sp);
  Built fused = Build(sp);
  FusionReport report;
  auto formed = FuseAttention(*fused.g, FusionOptions{}, &report);
  EXPECT_TRUE(formed.ok()) << formed.status().ToString();
  EXPECT_EQ(Formed(formed), 1);
  EXPECT_TRUE(fused.g->Verify().ok()) << fused.g->Verify().ToString() << "\n" << PrintGraph(*fused.g);
  EXPECT_EQ(CountOp(*fused.g, "FusedAttention"), 1) << PrintGraph(*fused.g);
  EXPECT_EQ(CountKernels(*fused.g), 1 + (sp.k4_output ? 1 : 0)) << PrintGraph(*fused.g);
  EXPECT_EQ(fused.g->outputs()[0]->name(), "out");

  const std::vector<Tensor> ins =
      RandomInputs(*unfused.g, seed, 0.05, 1.5, [](const Value& v, int64_t i, std::mt19937&) -> std::optional<double> {
        if (v.name() != "pad" && v.name() != "padb" && v.name() != "keepb") return std::nullopt;
        const int64_t n = v.shape().back();  // -1e4 (true; keepb: false) on the last 1..3 keys of each row
        const bool padded = (i % n) >= n - 1 - (i / n) % 3;
        if (v.name() == "keepb") return padded ? 0.0 : 1.0;
        return v.name() == "padb" ? (padded ? 1.0 : 0.0) : padded ? -1e4 : 0.0;
      });
  ThreadPool pool(threads);
  auto a = Execute(*unfused.g, Views(ins), CpuContext{&pool});
  auto b = Execute(*fused.g, Views(ins), CpuContext{&pool});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!a.ok() || !b.ok()) return report;
  ExpectClose((*b)[0], (*a)[0], "fused vs unfused");
  // Row blocks are computed the same way whichever thread runs them: no pool gives the same bits.
  auto serial = Execute(*fused.g, Views(ins), CpuContext{});
  EXPECT_TRUE(serial.ok()) << serial.status().ToString();
  if (serial.ok()) {
    EXPECT_EQ(0, std::memcmp((*serial)[0].data(), (*b)[0].data(), (*b)[0].nbytes()));
  }
  ExpectClose((*b)[0], Float64Attention(sp, fused, ins), "fused vs float64");
  // A plan leaves a constant mask's masked keys out where the scores allow (attention.cc's
  // MaskExpRow): the same bits as doing every key. (With k4_output the node reads a tensor the
  // plan computes, not a graph input.)
  if (!sp.k4_output) {
    EXPECT_TRUE(SameValues((*b)[0], RunUnprepared(*fused.g, ins, threads))) << "prepared vs unprepared";
  }

  // The reference graph on the fused node's own inputs reproduces its output.
  const Node* fa = FindOp(*fused.g, "FusedAttention");
  if (!fa || sp.k4_output) return report;
  const Graph* ref = fa->GetGraph("reference");
  EXPECT_NE(ref, nullptr);
  if (!ref) return report;
  EXPECT_EQ(ref->inputs().size(), fa->inputs().size());
  std::vector<TensorView> ref_in;
  for (const Value* in : fa->inputs()) {
    if (in->constant()) {
      ref_in.push_back(in->constant()->view());
      continue;
    }
    for (size_t i = 0; i < fused.g->inputs().size(); ++i)
      if (fused.g->inputs()[i] == in) ref_in.push_back(ins[i].view());
  }
  EXPECT_EQ(ref_in.size(), fa->inputs().size());
  auto c = Execute(*ref, ref_in, CpuContext{});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) ExpectClose((*b)[0], (*c)[0], "fused vs its reference graph");
  return report;
}

TEST(FuseAttention, DivScaleCausalMaskMergedHeads) {
  Spec sp;
  sp.mask = MaskForm::kCausal;
  Built unfused = Build(sp);
  // Transpose x4 (q, k, k^T, v), MatMul, Div, Add, Softmax, MatMul, Transpose: 10 launches.
  EXPECT_EQ(CountKernels(*unfused.g), 10);
  FusionReport r = FuseAndCheck(sp);
  ASSERT_EQ(r.groups.size(), 1u);
  const FusedGroupInfo& gi = r.groups[0];
  EXPECT_EQ(gi.name, "fused_attention_0");
  EXPECT_EQ(gi.kind, "attention");
  EXPECT_EQ(gi.nodes.size(), 14u);  // + 4 Reshapes (views)
  EXPECT_EQ(gi.kernel_name.rfind("attention_mask_h4_d32_f32_", 0), 0u) << gi.kernel_name;
  EXPECT_EQ(gi.kernel_name.size(), std::string("attention_mask_h4_d32_f32_").size() + 8);
}

TEST(FuseAttention, NoMaskMulScaleHeadSplitOutput) {
  Spec sp;
  sp.scale = ScaleForm::kMulRight;
  sp.merge_heads = false;
  FusionReport r = FuseAndCheck(sp);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].kernel_name.rfind("attention_h4_d32_f32_", 0), 0u) << r.groups[0].kernel_name;
}

TEST(FuseAttention, ScalarOnTheLeftAndDirectKeyTranspose) {
  Spec sp;
  sp.scale = ScaleForm::kMulLeft;
  sp.k_direct = true;
  sp.mask = MaskForm::kCausal2d;
  FuseAndCheck(sp);
}

TEST(FuseAttention, PaddingMaskInputAndTwoScaleFactors) {
  Spec sp;
  sp.scale = ScaleForm::kDivThenMul;
  sp.mask = MaskForm::kPadding;
  FuseAndCheck(sp);
}

// The spec's graph with only its attention fused (nothing run), and that FusedAttention node
// (null, after a failure, when none formed): for the tests that read the node's attributes.
struct FusedOnly {
  Built built;
  const Node* node = nullptr;
};
FusedOnly FuseOnly(const Spec& sp) {
  FusedOnly f{Build(sp)};
  EXPECT_EQ(Formed(FuseAttention(*f.built.g, FusionOptions{}, nullptr)), 1);
  f.node = FindOp(*f.built.g, "FusedAttention");
  EXPECT_NE(f.node, nullptr) << PrintGraph(*f.built.g);
  return f;
}

// A bool mask applied with Where (Hugging Face GPT-2's torch.where(causal, w, mask_value)) is
// the attention's mask too: the kernel keeps the scores it selects and puts the fill in the
// others; 40 rows cross the kernel's vectors and row blocks unevenly.
TEST(FuseAttention, BoolCausalMaskAppliedWithWhere) {
  Spec sp;
  sp.s = sp.sk = 40;
  sp.mask = MaskForm::kCausalBool;
  FusionReport r = FuseAndCheck(sp);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].kernel_name.rfind("attention_boolmask_h4_d32_f32_", 0), 0u) << r.groups[0].kernel_name;
  const FusedOnly f = FuseOnly(sp);
  ASSERT_NE(f.node, nullptr);
  EXPECT_EQ(f.node->GetInt("mask_select", 0), 1);
  EXPECT_EQ(f.node->GetFloat("mask_fill", 0), -INFINITY);
  sp.rope = true;  // LLaMA-style, with the same mask
  FuseAndCheck(sp);
}

// masked_fill(pad, lowest) as Where(pad, lowest, scores): the scores are kept where the mask is
// false, and a factor after the Where scales the fill as well.
TEST(FuseAttention, BoolPaddingMaskInputKeptWhereFalseAndScaledAfter) {
  Spec sp;
  sp.mask = MaskForm::kPaddingBool;
  FuseAndCheck(sp);
  const FusedOnly f = FuseOnly(sp);
  ASSERT_NE(f.node, nullptr);
  EXPECT_EQ(f.node->GetInt("mask_select", 0), -1);
  EXPECT_EQ(f.node->GetFloat("mask_fill", 0), 0.5f * std::numeric_limits<float>::lowest());
}

// Both masks, in both orders (Hugging Face's GPT-2 with an attention_mask applies the bool
// causal mask with Where, then adds the f32 padding mask): one kernel, and the order kept.
TEST(FuseAttention, BoolMaskAndAddedMaskInEitherOrder) {
  for (MaskForm form : {MaskForm::kCausalBoolThenPadding, MaskForm::kPaddingThenCausalBool}) {
    SCOPED_TRACE(form == MaskForm::kCausalBoolThenPadding ? "Where, then Add" : "Add, then Where");
    Spec sp;
    sp.s = sp.sk = 24;
    sp.mask = form;
    FusionReport r = FuseAndCheck(sp);
    ASSERT_EQ(r.groups.size(), 1u);
    EXPECT_EQ(r.groups[0].kernel_name.rfind("attention_mask_boolmask_h4_d32_f32_", 0), 0u) << r.groups[0].kernel_name;
    const FusedOnly f = FuseOnly(sp);
    ASSERT_NE(f.node, nullptr);
    EXPECT_EQ(f.node->GetInt("has_mask", 0), 1);
    EXPECT_EQ(f.node->GetInt("mask_select", 0), 1);
    EXPECT_EQ(f.node->GetInt("mask_select_first", -1), form == MaskForm::kCausalBoolThenPadding ? 1 : 0);
  }
}

// masked_fill(~keep, lowest): the Not (and the Cast of bool to bool) run inside the attention
// as a flipped selection, so the block is one kernel; when Not's result is also a graph
// output, the Not stays and the attention reads it.
TEST(FuseAttention, NegatedBoolMaskFlipsTheSelection) {
  Spec sp;
  sp.mask = MaskForm::kKeepNotBool;
  FusionReport r = FuseAndCheck(sp);  // one kernel in all
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(std::count_if(r.groups[0].nodes.begin(), r.groups[0].nodes.end(),
                          [](const std::string& n) { return n.find("Not") != std::string::npos || n.find("Cast") != std::string::npos; }),
            2);
  const FusedOnly f = FuseOnly(sp);
  ASSERT_NE(f.node, nullptr);
  EXPECT_EQ(f.node->GetInt("mask_select", 0), 1);
  EXPECT_EQ(f.node->input(3)->name(), "keepb");

  sp.not_output = true;
  const FusedOnly k = FuseOnly(sp);
  ASSERT_NE(k.node, nullptr);
  const Graph& kept = *k.built.g;
  EXPECT_EQ(CountOp(kept, "Not"), 1) << PrintGraph(kept);
  EXPECT_EQ(k.node->GetInt("mask_select", 0), -1);
  Built unfused = Build(sp);
  const std::vector<Tensor> ins = RandomInputs(*unfused.g, 9, 0.05, 1.5, [](const Value& v, int64_t i, std::mt19937&) -> std::optional<double> {
    if (v.name() != "keepb") return std::nullopt;
    return (i % v.shape().back()) < 12 ? 1.0 : 0.0;
  });
  auto a = Execute(*unfused.g, Views(ins), CpuContext{});
  auto b = Execute(kept, Views(ins), CpuContext{});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(kept.outputs().size(), 2u);
  const size_t o = kept.outputs()[0]->name() == "out" ? 0 : 1;  // the other is Not(keep)
  ExpectClose((*b)[o], (*a)[o], "fused vs unfused, Not kept");
  const Tensor &nb = (*b)[1 - o], &na = (*a)[1 - o];
  ASSERT_EQ(nb.dtype(), DType::kBool);
  EXPECT_EQ(0, std::memcmp(nb.data(), na.data(), na.nbytes())) << "the Not output";
}

// Where discards what it masks: a NaN score at a masked key leaves the row finite, as in the
// unfused graph, while the row that keeps that key is NaN in both.
TEST(FuseAttention, BoolMaskDropsANaNScoreItMasks) {
  Spec sp;
  sp.mask = MaskForm::kCausalBool;
  Built unfused = Build(sp), fused = Build(sp);
  ASSERT_EQ(Formed(FuseAttention(*fused.g, FusionOptions{}, nullptr)), 1);
  std::vector<Tensor> ins = RandomInputs(*unfused.g, 5, 0.05, 1.5);
  const int64_t last_key = sp.sk - 1;
  ins[1].SetFromDouble((0 * sp.sk + last_key) * sp.h * sp.d, std::nan(""));  // batch 0, key S-1, head 0
  ThreadPool pool(2);
  auto a = Execute(*unfused.g, Views(ins), CpuContext{&pool});
  auto b = Execute(*fused.g, Views(ins), CpuContext{&pool});
  ASSERT_TRUE(a.ok() && b.ok());
  int64_t nan_rows = 0;
  for (int64_t i = 0; i < (*a)[0].numel(); ++i) {
    const double x = (*a)[0].GetAsDouble(i), y = (*b)[0].GetAsDouble(i);
    ASSERT_EQ(std::isnan(x), std::isnan(y)) << "element " << i << ": unfused " << x << ", fused " << y;
    nan_rows += std::isnan(y);
    if (!std::isnan(x)) {
      EXPECT_NEAR(y, x, kAtol + kRtol * std::fabs(x)) << "element " << i;
    }
  }
  EXPECT_EQ(nan_rows, sp.d);  // batch 0, head 0, query row S-1: its d outputs
}

TEST(FuseAttention, NoScaleCrossAttention) {
  Spec sp;
  sp.scale = ScaleForm::kNone;
  sp.sk = 24;
  sp.mask = MaskForm::kPadding;
  FuseAndCheck(sp);
}

// Rows of keys shorter than one vector (decode's single key, a short prompt): the row's max
// comes from its ragged tail alone.
TEST(FuseAttention, KeyRowsShorterThanOneVector) {
  for (const int64_t n : {int64_t{1}, int64_t{7}}) {
    for (const MaskForm mask : {MaskForm::kCausal, MaskForm::kNone}) {
      Spec sp;
      sp.s = sp.sk = n;
      sp.mask = mask;
      sp.rope = FindSchema("Rope") != nullptr;
      FuseAndCheck(sp);
    }
  }
}

// Causal rows whose masked keys cannot be left out: a NaN in a future key's K (the unfused
// plan's rows all turn NaN through max and exp) and scores too large for the mask to push 1000
// below the max. The prepared plan must do those rows whole and give the unprepared bits.
TEST(FuseAttention, MaskedKeysAreLeftOutOnlyWhenTheScoresAllowIt) {
  Spec sp;
  sp.s = sp.sk = 40;
  sp.mask = MaskForm::kCausal2d;
  for (const int poison : {0, 1}) {
    SCOPED_TRACE(poison == 0 ? "NaN in a future key" : "huge scores");
    Built built = Build(sp);
    auto formed = FuseAttention(*built.g, FusionOptions{}, nullptr);
    ASSERT_EQ(Formed(formed), 1);
    std::vector<Tensor> ins = RandomInputs(*built.g, 11, 0.05, 1.5);
    float* k = ins[1].data_as<float>();  // [B, Sk, H*d]
    float* q = ins[0].data_as<float>();
    const int64_t hd = sp.h * sp.d;
    if (poison == 0) {
      k[30 * hd + 3] = std::nanf("");  // batch 0, key 30, head 0
    } else {
      for (int64_t j = 0; j < hd; ++j) q[(sp.s + 5) * hd + j] *= 1e30f;  // batch 1, query 5
    }
    ThreadPool pool(2);
    auto plan = Execute(*built.g, Views(ins), CpuContext{&pool});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const Tensor& out = (*plan)[0];  // [B, S, H*d]
    EXPECT_TRUE(SameValues(out, RunUnprepared(*built.g, ins, 2)));
    if (poison == 0) {  // every query row of batch 0, head 0 is NaN, the early ones included
      for (int64_t r = 0; r < sp.s; ++r) EXPECT_TRUE(std::isnan(out.data_as<float>()[r * hd])) << "row " << r;
      EXPECT_FALSE(std::isnan(out.data_as<float>()[sp.s * hd]));  // batch 1 untouched
    }
  }
}

TEST(FuseAttention, LongSequenceSplitsRowBlocksOverThreads) {
  Spec sp;
  sp.b = 1;
  sp.h = 3;
  sp.s = sp.sk = 300;  // 160 query rows per block (a constant mask): 2 blocks per head, the last one short
  sp.d = 16;
  sp.mask = MaskForm::kCausal;
  FuseAndCheck(sp, 4);
}

// One batch of two heads of 300 query rows: with a constant mask, two blocks of rows (0-159,
// 160-299). A fill beside an f32 padding mask as Hugging Face's (float's lowest).
Spec TwoRowBlocks(MaskForm form) {
  Spec sp;
  sp.b = 1;
  sp.h = 2;
  sp.s = sp.sk = 300;
  sp.d = 16;
  sp.mask = form;
  sp.dual_fill = std::numeric_limits<float>::lowest();
  return sp;
}

// Query rows in blocks (S = 300: rows 0-159, then 160-299): the first block's rows all drop
// keys 160 on through the constant mask, and the block leaves the whole vectors of them out of
// its Q K^T and P V products. Each mask form (beside the bool mask, an f32 padding input, with
// Hugging Face's fill, float's lowest), with K read as K^T (bhds) and with RoPE: fused ==
// unfused == float64, and the prepared plan's bits are those of doing every key.
TEST(FuseAttention, RowBlocksLeaveTheKeysTheMaskDropsOutOfTheProducts) {
  for (const MaskForm form : {MaskForm::kCausal, MaskForm::kCausalBool, MaskForm::kCausalBoolThenPadding,
                              MaskForm::kPaddingThenCausalBool}) {
    for (const int variant : {0, 1, 2}) {
      SCOPED_TRACE(testing::Message() << "mask form " << static_cast<int>(form) << ", variant " << variant);
      Spec sp = TwoRowBlocks(form);
      sp.k_direct = variant == 1;
      sp.rope = variant == 2 && FindSchema("Rope") != nullptr;
      FuseAndCheck(sp, 2);
    }
  }
}

// The mask is left unadded only over a row's leading zeros (+0 or -0): a constant causal mask
// whose kept keys carry a bias from the middle of each row on (and zeros of both signs before
// it) must still weigh that bias, in both row blocks, with and without RoPE.
TEST(FuseAttention, CausalMaskBiasOnKeptKeysIsAdded) {
  for (const bool rope : {false, true}) {
    SCOPED_TRACE(rope ? "rope" : "no rope");
    Spec sp = TwoRowBlocks(MaskForm::kCausal);
    sp.live_bias = true;
    sp.rope = rope && FindSchema("Rope") != nullptr;
    FuseAndCheck(sp, 2);
  }
}

// What must keep the dropped keys in the products (the first block's keys 160 on; key 260
// here, and the last key, 299, for a NaN in K or V): a NaN or inf in their V rows (a zero
// weight times it is NaN, over every key, as in the unfused MatMul), their scores under an f32
// mask when not provably far below the row's max (a NaN in K; a mask of -1e4 with scores up to
// 1e5 there, which the rows must then weigh; the block's last query row, 159, scaled up alone,
// with the dropped keys twice as long as the kept ones: they outweigh that row's kept keys),
// and, Where before the added mask, a NaN in the added mask at a dropped key. Each gives the
// bits of doing every key.
TEST(FuseAttention, DroppedKeysStayInTheProductsWhenTheyCanReachTheOutput) {
  enum Poison { kNaNInV, kInfInV, kNaNInK, kHugeKUnderSmallMask, kHugeLastQueryUnderSmallMask, kNaNInPadding };
  for (const Poison poison :
       {kNaNInV, kInfInV, kNaNInK, kHugeKUnderSmallMask, kHugeLastQueryUnderSmallMask, kNaNInPadding}) {
    for (const MaskForm form : {MaskForm::kCausal, MaskForm::kCausalBool, MaskForm::kCausalBoolThenPadding}) {
      for (const int64_t key : {int64_t{260}, int64_t{299}}) {
        if ((poison == kNaNInPadding) != (form == MaskForm::kCausalBoolThenPadding)) continue;
        const bool small_mask = poison == kHugeKUnderSmallMask || poison == kHugeLastQueryUnderSmallMask;
        if (small_mask && form != MaskForm::kCausal) continue;
        if (key == 299 && poison != kNaNInV && poison != kNaNInK) continue;
        SCOPED_TRACE(testing::Message() << "poison " << poison << ", mask form " << static_cast<int>(form) << ", key "
                                        << key);
        Spec sp = TwoRowBlocks(form);
        if (small_mask) sp.causal_value = -1e4f;
        Built built = Build(sp);
        ASSERT_EQ(Formed(FuseAttention(*built.g, FusionOptions{}, nullptr)), 1);
        std::vector<Tensor> ins = RandomInputs(*built.g, 5, 0.05, 1.5);
        const int64_t hd = sp.h * sp.d;
        float* q = ins[0].data_as<float>();  // [1, S, H*d]; head 0's dims come first
        float* k = ins[1].data_as<float>();
        float* v = ins[2].data_as<float>();
        if (poison == kNaNInV) v[key * hd + 3] = std::nanf("");
        if (poison == kInfInV) v[key * hd + 3] = INFINITY;
        if (poison == kNaNInK) k[key * hd + 3] = std::nanf("");
        if (poison == kHugeKUnderSmallMask)
          for (int64_t t = 160; t < sp.sk; ++t)
            for (int64_t j = 0; j < sp.d; ++j) k[t * hd + j] *= 3e4f;
        if (poison == kHugeLastQueryUnderSmallMask) {  // and the dropped keys twice as long as the kept ones
          for (int64_t j = 0; j < sp.d; ++j) q[159 * hd + j] *= 3e4f;
          for (int64_t t = 160; t < sp.sk; ++t)
            for (int64_t j = 0; j < sp.d; ++j) k[t * hd + j] *= 2.f;
        }
        if (poison == kNaNInPadding) ins[3].data_as<float>()[key] = std::nanf("");
        ThreadPool pool(2);
        auto plan = Execute(*built.g, Views(ins), CpuContext{&pool});
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        const Tensor& out = (*plan)[0];  // [1, S, H*d]
        EXPECT_TRUE(SameValues(out, RunUnprepared(*built.g, ins, 2)));
        const float first = out.data_as<float>()[3];  // query 0, head 0, dim 3
        switch (poison) {
          case kNaNInV:
          case kInfInV:
            EXPECT_TRUE(std::isnan(first));  // 0 * NaN, 0 * inf
            EXPECT_FALSE(std::isnan(out.data_as<float>()[4]));
            break;
          case kNaNInK:  // the f32 mask adds to the NaN score; Where replaces it
            EXPECT_EQ(std::isnan(first), form == MaskForm::kCausal);
            break;
          case kHugeKUnderSmallMask:  // query 0's keys 160.. weigh in: -1e4 is no longer far below
          case kHugeLastQueryUnderSmallMask:  // query 159's keys 160.. do
            ExpectClose(out, Float64Attention(sp, built, ins), "fused vs float64");
            break;
          case kNaNInPadding:  // fill + NaN at a dropped key: every row of the batch
            EXPECT_TRUE(std::isnan(first));
            break;
        }
      }
    }
  }
}

TEST(FuseAttention, SharedHeadSplitKeyStaysOutsideAndIsReadInPlace) {
  // k4 is also a graph output (a KV cache): its Transpose keeps running for that reader, and
  // the fused kernel reads k4 as [B,H,Sk,d] rather than recomputing anything.
  Spec sp;
  sp.mask = MaskForm::kCausal;
  sp.k4_output = true;
  FusionReport r = FuseAndCheck(sp);
  Built f = Build(sp);
  FusionReport r2;
  ASSERT_TRUE(FuseAttention(*f.g, FusionOptions{}, &r2).ok());
  const Node* fa = FindOp(*f.g, "FusedAttention");
  ASSERT_NE(fa, nullptr);
  EXPECT_EQ(fa->GetString("k_layout", ""), "bhsd");
  EXPECT_EQ(fa->GetString("q_layout", ""), "bshd");
}

TEST(FuseAttention, RefusesWhenScoresAreAGraphOutput) {
  Spec sp;
  sp.mask = MaskForm::kCausal;
  sp.scores_output = true;
  Built b = Build(sp);
  const int64_t before = CountKernels(*b.g);
  FusionReport r;
  auto formed = FuseAttention(*b.g, FusionOptions{}, &r);
  ASSERT_TRUE(formed.ok()) << formed.status().ToString();
  EXPECT_EQ(*formed, 0);
  EXPECT_EQ(CountOp(*b.g, "FusedAttention"), 0);
  EXPECT_EQ(CountKernels(*b.g), before);
  ASSERT_TRUE(HasRefusal(r, "attention-intermediate-escapes"));
  for (const auto& x : r.refusals)
    if (x.code == "attention-intermediate-escapes") {
      EXPECT_FALSE(x.producer.empty());
      EXPECT_FALSE(x.consumer.empty());
    }
}

TEST(FuseAttention, RefusesWhenProbabilitiesHaveAnotherReader) {
  Spec sp;
  Built b = Build(sp);
  // A second reader of the softmax output.
  const Node* sm = FindOp(*b.g, "Softmax");
  ASSERT_NE(sm, nullptr);
  auto extra = b.g->AddNode("Relu", {sm->output()});
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(b.g->MarkOutput((*extra)->output()).ok());
  FusionReport r;
  EXPECT_EQ(Formed(FuseAttention(*b.g, FusionOptions{}, &r)), 0);
  EXPECT_TRUE(HasRefusal(r, "attention-intermediate-escapes"));
}

// f16 attention fuses only where the target's kernels take it (FusionOptions::narrow_row_kernels).
TEST(FuseAttention, NarrowAttentionFusesOnlyWhereTheTargetTakesIt) {
  Spec sp;
  sp.dtype = DType::kF16;
  sp.mask = MaskForm::kCausal;
  Built b = Build(sp);
  FusionReport r;
  FusionOptions f32_only;
  f32_only.narrow_row_kernels = false;
  auto formed = FuseAttention(*b.g, f32_only, &r);
  ASSERT_TRUE(formed.ok()) << formed.status().ToString();
  EXPECT_EQ(*formed, 0);
  EXPECT_EQ(CountOp(*b.g, "FusedAttention"), 0);
  EXPECT_TRUE(HasRefusal(r, "attention-unsupported-dtype"));

  Built n = Build(sp);
  FusionReport rn;
  EXPECT_EQ(Formed(FuseAttention(*n.g, FusionOptions{}, &rn)), 1);
  ASSERT_EQ(CountOp(*n.g, "FusedAttention"), 1);
  EXPECT_FALSE(HasRefusal(rn, "attention-unsupported-dtype"));
  for (const auto& node : n.g->nodes()) {
    if (node->op() == "FusedAttention") {
      EXPECT_EQ(node->output()->dtype(), DType::kF16);
    }
  }
}

TEST(FuseAttention, DisabledOrExcludedChangesNothing) {
  Spec sp;
  Built b = Build(sp);
  const std::string before = PrintGraph(*b.g);
  FusionOptions off;
  off.enabled = false;
  FusionReport r;
  EXPECT_EQ(Formed(FuseAttention(*b.g, off, &r)), 0);
  EXPECT_EQ(PrintGraph(*b.g), before);
  EXPECT_TRUE(r.groups.empty() && r.refusals.empty());

  FusionOptions ex;
  ex.exclude.insert("fused_attention_0");
  EXPECT_EQ(Formed(FuseAttention(*b.g, ex, &r)), 0);
  EXPECT_EQ(PrintGraph(*b.g), before);
  EXPECT_TRUE(HasRefusal(r, "excluded"));
}

TEST(FuseAttention, PipelineReportsTheGroupAndKernelCounts) {
  Spec sp;
  sp.mask = MaskForm::kCausal;
  for (bool enabled : {false, true}) {
    Built b = Build(sp);
    PipelineOptions po;
    po.fusion.enabled = enabled;
    FusionReport rep;
    po.fusion_report = &rep;
    auto rec = RunPipeline(*b.g, cpu::DefaultCpuTarget(), po);
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rep.kernels_before, 10);
    EXPECT_EQ(rep.kernels_after, enabled ? 1 : 10);
    bool found = false;
    for (const auto& gi : rep.groups) found |= gi.kind == "attention";
    EXPECT_EQ(found, enabled);
  }
}

TEST(FuseAttention, WithRope) {
  if (FindSchema("Rope") == nullptr) GTEST_SKIP() << "the Rope op is not in the registry yet (src/cpu/kernels/rope.cc)";
  Spec sp;
  sp.rope = true;
  sp.mask = MaskForm::kCausal;
  FusionReport r = FuseAndCheck(sp);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].kernel_name.rfind("attention_rope_mask_h4_d32_f32_", 0), 0u) << r.groups[0].kernel_name;
  EXPECT_EQ(r.groups[0].nodes.size(), 16u);  // the two Rope nodes too
}

TEST(FuseAttention, KernelRejectsInconsistentAttributesWithAStatus) {
  // A FusedAttention whose attributes do not describe its inputs: an error naming the op.
  Graph g;
  Value* q = g.AddInput("q", DType::kF32, {1, 4, 8}).value();
  AttributeMap attrs{{"batch", int64_t{1}},  {"heads", int64_t{2}},    {"seq_q", int64_t{4}},
                     {"seq_k", int64_t{4}},  {"head_dim", int64_t{8}}, {"output_shape", std::vector<int64_t>{1, 4, 16}}};
  auto n = g.AddNode("FusedAttention", {q, q, q}, attrs);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("FusedAttention"), std::string::npos) << n.status().ToString();
}

// Heads whose weights ([K, 3d]) outgrow half of L2 are projected and roped in groups (attention.cc,
// HeadGroup): K = 8192, d = 16 gives 1.5 MB a head, so two heads a task. The projected node
// must agree with the two nodes it replaces (a QKV FusedGemm and a FusedAttention with RoPE
// and a causal mask), both with its packed heads and without them (the sgemm path).
TEST(FuseAttention, ProjectedHeadsInGroupsMatchTheTwoNodes) {
  constexpr int64_t kB = 2, kS = 16, kH = 8, kD = 16, kK = 8192, kN = kH * kD;
  auto random_tensor = [](const Shape& shape, uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, shape).value());
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = u(rng);
    return t;
  };
  auto build = [&](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {kB, kS, kK}).value();
    Value* w = g.AddConstant("w", random_tensor({kK, 3 * kN}, 11, 0.02f)).value();
    auto mask = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {kS, kS}).value());
    for (int64_t i = 0; i < kS; ++i)
      for (int64_t j = 0; j < kS; ++j) mask->data_as<float>()[i * kS + j] = j <= i ? 0.f : -1e9f;
    Value* m = g.AddConstant("mask", mask).value();
    Value* c = g.AddConstant("cos", random_tensor({kS, kD}, 12, 1.f)).value();
    Value* sn = g.AddConstant("sin", random_tensor({kS, kD}, 13, 1.f)).value();
    Node* qkv = g.AddNode("FusedGemm", {x, w}, {{"splits", int64_t{3}}, {"out_proj", std::vector<int64_t>{0, 1, 2}}},
                          "qkv", 3)
                    .value();
    AttributeMap attrs{{"batch", kB},         {"heads", kH},          {"seq_q", kS},
                       {"seq_k", kS},         {"head_dim", kD},       {"v_head_dim", kD},
                       {"scale", 0.25f},      {"has_mask", int64_t{1}}, {"rope_q", int64_t{1}},
                       {"rope_k", int64_t{1}}, {"output_shape", std::vector<int64_t>{kB, kS, kN}}};
    Node* att = g.AddNode("FusedAttention", {qkv->output(0), qkv->output(1), qkv->output(2), m, c, sn}, attrs, "att")
                    .value();
    ASSERT_TRUE(g.MarkOutput(att->output()).ok());
  };
  Graph two, one;
  build(two);
  build(one);
  ASSERT_EQ(two.num_nodes(), 2u);
  FusionOptions options;
  auto formed = FuseAttentionProjections(one, options, nullptr);
  ASSERT_TRUE(formed.ok()) << formed.status().ToString();
  ASSERT_EQ(*formed, 1);
  ASSERT_EQ(one.num_nodes(), 1u);
  const Node* att = one.nodes().front().get();
  EXPECT_EQ(att->GetInt("qkv_proj", 0), 1);

  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  std::shared_ptr<Tensor> x = random_tensor({kB, kS, kK}, 14, 1.f);
  const TensorView in[] = {x->view()};
  auto want = Execute(two, in, ctx);
  auto got = Execute(one, in, ctx);
  ASSERT_TRUE(want.ok() && got.ok());
  // Not the same bits: oneDNN may sum K in another order for another block width (a 96-column
  // group here against 64-column blocks; 1.2e-6 at a peak of 2.1 measured). A few ulp of the
  // peak; a wrong head, third or batch would be off by the values themselves.
  const double peak = MaxAbs((*want)[0]);
  EXPECT_LT(MaxAbsDiff((*got)[0], (*want)[0]), 1e-6 * (1 + peak)) << "packed heads in groups";
  // The node without its packed heads.
  std::vector<TensorView> views{x->view()};
  for (size_t i = 1; i < att->inputs().size(); ++i) views.push_back(att->input(i)->constant()->view());
  Tensor once = Tensor::Empty(DType::kF32, att->output()->shape()).value();
  std::vector<TensorView> out{once.view()};
  ASSERT_TRUE(RunNodeOnce(*att, views, out, ctx).ok());
  EXPECT_LT(MaxAbsDiff(once, (*want)[0]), 1e-5 * (1 + peak)) << "the sgemm path in groups";
  EXPECT_GT(peak, 0.1);
}

// The QKV projection inside the attention (FuseAttentionProjections): LLaMA blocks built by the
// demo's builder (RoPE, causal mask, no biases), with two batches and, at 300 positions, several
// blocks of query rows per head. The projected plan must agree within a few ulp with the plan
// that keeps the QKV GEMM and the attention apart (the same softmax rows; oneDNN may order K
// differently for another column-block width), match the unfused plan, and the node run without
// its packed heads (the sgemm path) must agree with its reference. A q that something else also
// reads keeps the two nodes apart.
Tensor UniformTensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t = Tensor::Empty(DType::kF32, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
  return t;
}

// A small LLaMA block (llama-small's family), built once per pipeline option set, after
// running each pipeline; `eps` is the norms' epsilon (the preset's when negative).
std::vector<std::unique_ptr<Graph>> SmallBlocks(const CpuContext& ctx, int64_t seq, float eps,
                                                std::vector<PipelineOptions> options, BlockConfig* cfg_out,
                                                const std::string& preset = "llama-small") {
  std::vector<std::unique_ptr<Graph>> graphs;
  auto cfg = BlockPreset(preset);
  EXPECT_TRUE(cfg.ok());
  cfg->seq = seq, cfg->batch = 2, cfg->hidden = 128, cfg->heads = 4, cfg->ffn = 160;
  if (eps >= 0) cfg->eps = eps;
  auto w = MakeBlockWeights(*cfg, 5, ctx);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  for (const PipelineOptions& o : options) {
    graphs.push_back(std::make_unique<Graph>());
    EXPECT_TRUE(BuildBlock(*graphs.back(), *cfg, *w).ok());
    EXPECT_TRUE(RunPipeline(*graphs.back(), cpu::DefaultCpuTarget(), o).ok());
  }
  *cfg_out = *cfg;
  return graphs;
}

// Runs `node` once on fresh random inputs (constants as they are; `rows` rescales row r of each
// other input by rows(r)), unprepared, and its reference graph on the same inputs; returns
// (max |difference|, the reference's peak).
std::pair<double, double> NodeAgainstReference(const Node& node, const CpuContext& ctx,
                                               const std::function<float(int64_t)>& rows = nullptr) {
  std::vector<Tensor> node_in;
  node_in.reserve(node.inputs().size());
  std::vector<TensorView> views;
  for (const Value* v : node.inputs()) {
    if (v->constant()) {
      views.push_back(v->constant()->view());
      continue;
    }
    node_in.push_back(UniformTensor(v->shape(), 90 + static_cast<uint32_t>(views.size())));
    Tensor& t = node_in.back();
    const int64_t k = v->shape().back();
    if (rows)
      for (int64_t r = 0; r < t.numel() / k; ++r)
        for (int64_t j = 0; j < k; ++j) t.data_as<float>()[r * k + j] *= rows(r);
    views.push_back(t.view());
  }
  Tensor once = Tensor::Empty(DType::kF32, node.output()->shape()).value();
  std::vector<TensorView> out{once.view()};
  EXPECT_TRUE(RunNodeOnce(node, views, out, ctx).ok());
  auto ref = Execute(*node.GetGraph("reference"), views, ctx);
  EXPECT_TRUE(ref.ok()) << ref.status().ToString();
  if (!ref.ok()) return {INFINITY, 0};
  return {MaxAbsDiff(once, (*ref)[0]), MaxAbs((*ref)[0])};
}

// FoldNormIntoGemm on the whole LLaMA block: the input RMSNorm folds into the projected
// attention (x itself, W times the norm's scale, each row's 1/rms taken before the heads and
// applied to q, k and v), the post-attention one into o_proj and gate/up (fuse_gemm_test.cc
// checks that form against float64): 4 kernels. Against the unfused plan and the plan without
// the fold; the attention node alone (its sgemm path, unprepared) against its reference graph.
TEST(FoldNormIntoGemm, LlamaBlockRunsInFourKernels) {
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  PipelineOptions off, on_plain, on;
  off.fusion.enabled = false;
  on_plain.fusion.norm_into_gemm = false;  // the CPU target's plan without the fold
  FusionReport report;
  on.fusion_report = &report;
  BlockConfig cfg;
  auto graphs = SmallBlocks(ctx, 40, 0.05f /* large enough that a wrong epsilon shows */, {off, on_plain, on}, &cfg);
  ASSERT_EQ(graphs.size(), 3u);
  const Graph &unfused = *graphs[0], &plain = *graphs[1], &folded = *graphs[2];
  EXPECT_EQ(CountKernels(plain), 6);
  EXPECT_EQ(CountKernels(folded), 4);
  EXPECT_EQ(CountOp(folded, "RMSNorm"), 0);
  const Node* att = FindOp(folded, "FusedAttention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->attrs().count("rms_epsilon"), 1u);
  const FusedGroupInfo* group = nullptr;
  for (const FusedGroupInfo& gi : report.groups)
    if (gi.name == att->name()) group = &gi;
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->nodes.front(), "/input_norm/RMSNorm");

  Tensor x = UniformTensor({cfg.batch, cfg.seq, cfg.hidden}, 77);
  const TensorView in[] = {x.view()};
  auto yu = Execute(unfused, in, ctx);
  auto yp = Execute(plain, in, ctx);
  auto yf = Execute(folded, in, ctx);
  ASSERT_TRUE(yu.ok() && yp.ok() && yf.ok());
  const double peak = MaxAbs((*yu)[0]);
  EXPECT_GT(peak, 0.1);
  EXPECT_LT(MaxAbsDiff((*yu)[0], (*yf)[0]), 1e-4 * (1 + peak));
  EXPECT_LT(MaxAbsDiff((*yp)[0], (*yf)[0]), 1e-5 * (1 + peak)) << "against the plan without the fold";

  // The attention node alone (its sgemm path), rows of x far from unit RMS (0.1 to 4).
  const auto [diff, ref_peak] =
      NodeAgainstReference(*att, ctx, [](int64_t r) { return 0.1f + 3.9f * static_cast<float>(r % 7) / 6.f; });
  EXPECT_GT(ref_peak, 0.1);
  EXPECT_LT(diff, 1e-5 * (1 + ref_peak)) << "the folded attention against its reference";
}

TEST(FuseAttention, QkvProjectionMovesIntoTheAttention) {
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  for (const int64_t seq : {int64_t{40}, int64_t{300}}) {
    PipelineOptions off, no_proj, on;
    off.fusion.enabled = false;
    no_proj.fusion.attention_projection = false;
    // The projection alone: neither plan folds the norms, so the two differ only by it.
    no_proj.fusion.norm_into_gemm = on.fusion.norm_into_gemm = false;
    FusionReport report;
    on.fusion_report = &report;
    BlockConfig cfg;
    auto graphs = SmallBlocks(ctx, seq, -1, {off, no_proj, on}, &cfg);
    ASSERT_EQ(graphs.size(), 3u);
    const Graph &unfused = *graphs[0], &apart = *graphs[1], &projected = *graphs[2];
    const Node* att = nullptr;
    for (const auto& n : projected.nodes())
      if (n->op() == "FusedAttention") att = n.get();
    ASSERT_NE(att, nullptr);
    EXPECT_EQ(att->GetInt("qkv_proj", 0), 1);
    EXPECT_EQ(CountOp(projected, "FusedGemm") + 1, CountOp(apart, "FusedGemm")) << "the QKV GEMM moved in";
    const FusedGroupInfo* group = nullptr;
    for (const FusedGroupInfo& gi : report.groups)
      if (gi.name == att->name()) group = &gi;
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->kind, "attention");
    EXPECT_NE(std::find(group->nodes.begin(), group->nodes.end(), "/q_proj/MatMul"), group->nodes.end());
    ASSERT_NE(att->GetGraph("reference"), nullptr);
    EXPECT_EQ(att->GetGraph("reference")->num_nodes(), 2u) << "the reference is the QKV GEMM and the attention";

    Tensor x = UniformTensor({cfg.batch, seq, cfg.hidden}, 77);
    const TensorView in[] = {x.view()};
    auto yu = Execute(unfused, in, ctx);
    auto ya = Execute(apart, in, ctx);
    auto yp = Execute(projected, in, ctx);
    ASSERT_TRUE(yu.ok() && ya.ok() && yp.ok());
    const std::string what = StrCat("seq ", seq);
    const double peak = MaxAbs((*yu)[0]);
    EXPECT_LT(MaxAbsDiff((*yu)[0], (*yp)[0]), 1e-4 * (1 + peak)) << what;
    EXPECT_GT(peak, 0.1) << what;
    EXPECT_LT(MaxAbsDiff((*ya)[0], (*yp)[0]), 1e-6 * (1 + peak)) << what << ": against the QKV GEMM and the attention apart";

    // The projected node alone, without its packed heads (the sgemm path), on fresh inputs:
    // the attention's output of the whole plan is not observable, so compare the node against
    // its reference graph run the same way.
    EXPECT_LT(NodeAgainstReference(*att, ctx).first, 1e-4) << what << ": the sgemm path against the reference";
  }

  // q also read elsewhere (a graph output): the two nodes stay apart.
  Graph g;
  auto cfg = BlockPreset("llama-small");
  ASSERT_TRUE(cfg.ok());
  cfg->seq = 16, cfg->hidden = 64, cfg->heads = 2, cfg->ffn = 96;
  auto w = MakeBlockWeights(*cfg, 6, ctx);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(BuildBlock(g, *cfg, *w).ok());
  Value* q = nullptr;
  for (const auto& n : g.nodes())
    if (n->name() == "/q_proj/MatMul") q = n->output();
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(g.MarkOutput(q).ok());
  FusionReport apart_report;
  PipelineOptions with_report;
  with_report.fusion_report = &apart_report;
  ASSERT_TRUE(RunPipeline(g, cpu::DefaultCpuTarget(), with_report).ok());
  for (const auto& n : g.nodes())
    if (n->op() == "FusedAttention") {
      EXPECT_EQ(n->GetInt("qkv_proj", 0), 0) << "q is a graph output";
    }
  EXPECT_NE(FindRefusal(apart_report, "too-many-outputs"), nullptr) << "the refusal says why";
}

// GPT-2 blocks (biased q, k, v projections): the QKV GEMM with its bias epilogue moves into the
// attention too (qkv_bias), and agrees with the two nodes apart, with the unfused plan, and (the
// sgemm path) with its reference graph.
TEST(FuseAttention, QkvProjectionWithBiasesMovesIntoTheAttention) {
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  for (const int64_t seq : {int64_t{40}, int64_t{300}}) {
    PipelineOptions off, no_proj, on;
    off.fusion.enabled = false;
    no_proj.fusion.attention_projection = false;
    FusionReport report;
    on.fusion_report = &report;
    BlockConfig cfg;
    auto graphs = SmallBlocks(ctx, seq, -1, {off, no_proj, on}, &cfg, "gpt2");
    ASSERT_EQ(graphs.size(), 3u);
    const Graph &unfused = *graphs[0], &apart = *graphs[1], &projected = *graphs[2];
    const Node* att = FindOp(projected, "FusedAttention");
    ASSERT_NE(att, nullptr);
    EXPECT_EQ(att->GetInt("qkv_proj", 0), 1);
    EXPECT_EQ(att->GetInt("qkv_bias", 0), 1);
    EXPECT_EQ(CountKernels(projected) + 1, CountKernels(apart)) << "the QKV GEMM moved in";
    const FusedGroupInfo* group = nullptr;
    for (const FusedGroupInfo& gi : report.groups)
      if (gi.name == att->name()) group = &gi;
    ASSERT_NE(group, nullptr);
    EXPECT_NE(std::find(group->nodes.begin(), group->nodes.end(), "/q_proj/MatMul"), group->nodes.end());
    EXPECT_NE(std::find(group->nodes.begin(), group->nodes.end(), "/q_proj/Add"), group->nodes.end())
        << "the bias adds are in the attention's group";

    Tensor x = UniformTensor({cfg.batch, seq, cfg.hidden}, 78);
    const TensorView in[] = {x.view()};
    auto yu = Execute(unfused, in, ctx);
    auto ya = Execute(apart, in, ctx);
    auto yp = Execute(projected, in, ctx);
    ASSERT_TRUE(yu.ok() && ya.ok() && yp.ok());
    const std::string what = StrCat("seq ", seq);
    const double peak = MaxAbs((*yu)[0]);
    EXPECT_GT(peak, 0.1) << what;
    EXPECT_LT(MaxAbsDiff((*yu)[0], (*yp)[0]), 1e-4 * (1 + peak)) << what;
    EXPECT_LT(MaxAbsDiff((*ya)[0], (*yp)[0]), 1e-6 * (1 + peak)) << what << ": against the QKV GEMM and the attention apart";
    EXPECT_LT(NodeAgainstReference(*att, ctx).first, 1e-4) << what << ": the sgemm path against the reference";
  }
}

// Runs `text` through the pipeline unfused and fused; expects one FusedAttention, `kernels`
// kernels in the fused plan, and equal outputs (kAtol / kRtol) on the same random inputs.
void AttentionTextMatchesUnfused(const std::string& text, int64_t kernels) {
  auto unfused = ParseGraph(text);
  auto fused = ParseGraph(text);
  ASSERT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString();
  PipelineOptions off, on;
  off.fusion.enabled = false;
  ASSERT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
  const auto p = RunPipeline(**fused, cpu::DefaultCpuTarget(), on);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CountOp(**fused, "FusedAttention"), 1) << PrintGraph(**fused);
  EXPECT_EQ(CountKernels(**fused), kernels) << PrintGraph(**fused);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  const std::vector<Tensor> ins = RandomInputs(**unfused, 11, 0.1, 1.5);
  auto yu = Execute(**unfused, Views(ins), ctx);
  auto yf = Execute(**fused, Views(ins), ctx);
  ASSERT_TRUE(yu.ok() && yf.ok());
  ExpectClose((*yf)[0], (*yu)[0], "fused against unfused");
  const Node* att = FindOp(**fused, "FusedAttention");
  ASSERT_NE(att, nullptr);
  EXPECT_LT(NodeAgainstReference(*att, ctx).first, kAtol) << "the node against its reference";
}

// nn.MultiheadAttention as nn.TransformerEncoderLayer exports it (batch_first=False): x is
// (S=5, B=2, E=12), 3 heads of 4, heads (S, B*H, d) transposed to (B*H, S, d), q divided by
// sqrt(d) before the scores, an additive [S, S] mask (baddbmm), bmm, heads merged to (S*B, E).
// One kernel: the attention reads q, k and v where they are and writes (S*B, E) order.
TEST(FuseAttention, MultiheadAttentionLayoutMatchesUnfused) {
  std::string mask = "  %mask: f32[5,5] = const [";
  for (int i = 0; i < 25; ++i) mask += StrCat(i ? ", " : "", i % 5 > i / 5 ? -1e9 : 0.25 * (i % 3));
  mask += "]\n";
  AttentionTextMatchesUnfused(R"(graph @mha(%q: f32[5,2,12], %k: f32[5,2,12], %v: f32[5,2,12]) {
  %shape: i64[3] = const [5, 6, 4]
  %oshape: i64[2] = const [10, 12]
  %c: f32[] = const [2.0]
)" + mask + R"(  %qr = Reshape(%q, %shape)
  %q3 = Transpose(%qr) {perm = [1, 0, 2]}
  %qs = Div(%q3, %c)
  %kr = Reshape(%k, %shape)
  %kt = Transpose(%kr) {perm = [1, 2, 0]}
  %vr = Reshape(%v, %shape)
  %v3 = Transpose(%vr) {perm = [1, 0, 2]}
  %s = MatMul(%qs, %kt)
  %sm = Add(%mask, %s)
  %p = Softmax(%sm) {axis = -1}
  %o3 = MatMul(%p, %v3)
  %ot = Transpose(%o3) {perm = [1, 0, 2]}
  %out = Reshape(%ot, %oshape)
  return %out
})",
                              1);
}

// nn.MultiheadAttention seq-first as the dynamo exporter writes it: q, k, v [S=5, B=2, E=12]
// viewed as [S, B, H=3, d=4] and transposed to [B, H, S, d] (K^T: perm 1,2,3,0), the output
// transposed back to [S, B, H, d] and merged to [S*B, E]. It runs as one sequence of B*H heads:
// one kernel, reading q, k and v in place.
std::string SeqFirstText(const std::string& mask_decl, const std::string& masked) {
  return R"(graph @seq_first(%q: f32[5,2,12], %k: f32[5,2,12], %v: f32[5,2,12])" + mask_decl + R"() {
  %shape: i64[4] = const [5, 2, 3, 4]
  %oshape: i64[2] = const [10, 12]
  %c: f32[] = const [0.5]
  %qr = Reshape(%q, %shape)
  %q4 = Transpose(%qr) {perm = [1, 2, 0, 3]}
  %kr = Reshape(%k, %shape)
  %kt = Transpose(%kr) {perm = [1, 2, 3, 0]}
  %vr = Reshape(%v, %shape)
  %v4 = Transpose(%vr) {perm = [1, 2, 0, 3]}
  %s = MatMul(%q4, %kt)
  %s1 = Mul(%s, %c)
)" + masked + R"(  %p = Softmax(%s2) {axis = -1}
  %o4 = MatMul(%p, %v4)
  %ot = Transpose(%o4) {perm = [2, 0, 1, 3]}
  %out = Reshape(%ot, %oshape)
  return %out
})";
}

TEST(FuseAttention, SeqFirstHeadsRunAsOneSequenceOfMergedHeads) {
  AttentionTextMatchesUnfused(SeqFirstText("", "  %s2 = Identity(%s1)\n"), 1);
  // A mask shared by every batch and head merges with them.
  AttentionTextMatchesUnfused(SeqFirstText(", %mask: f32[5,5]", "  %s2 = Add(%s1, %mask)\n"), 1);
}

// `text` through the fused pipeline, checked against its unfused plan (one attention kernel);
// the FusedAttention's attributes. No Rope kernel may be left.
AttributeMap FusedAttentionAttrs(const std::string& text) {
  AttentionTextMatchesUnfused(text, 1);
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok());
  if (!g.ok()) return {};
  EXPECT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), PipelineOptions{}).ok());
  EXPECT_EQ(CountOp(**g, "Rope"), 0) << PrintGraph(**g);
  const Node* att = FindOp(**g, "FusedAttention");
  EXPECT_NE(att, nullptr);
  return att ? att->attrs() : AttributeMap{};
}

// Gemma 2's logit soft-capping, c * tanh(s / c) between the scale and the mask: inside the one
// kernel (softcap = c, the 1 / c joining the scale).
TEST(FuseAttention, SoftCappedScoresRunInTheKernel) {
  const std::string text = R"(graph @softcap(%q: f32[1,2,6,8], %k: f32[1,2,6,8], %v: f32[1,2,6,8], %mask: f32[1,1,6,6]) {
  %scale: f32[] = const [0.35355339]
  %cap: f32[] = const [2.0]
  %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
  %s = MatMul(%q, %kt)
  %s1 = Mul(%s, %scale)
  %s2 = Div(%s1, %cap)
  %t = Tanh(%s2)
  %s3 = Mul(%t, %cap)
  %s4 = Add(%s3, %mask)
  %p = Softmax(%s4) {axis = -1}
  %o = MatMul(%p, %v)
  return %o
})";
  const AttributeMap a = FusedAttentionAttrs(text);
  EXPECT_FLOAT_EQ(AttrFloat(a, "softcap", 0), 2.0f);
  EXPECT_NEAR(AttrFloat(a, "scale", 0), 0.35355339 / 2.0, 1e-7);
}

// Partial rotary (Rope with rotary_dim: the first 4 of 8 values rotated) on Q and K runs inside
// the kernel: no Rope kernel is left.
TEST(FuseAttention, PartialRotaryRunsInTheKernel) {
  const std::string text = R"(graph @partial(%q: f32[1,2,6,8], %k: f32[1,2,6,8], %v: f32[1,2,6,8], %cos: f32[1,1,6,4], %sin: f32[1,1,6,4]) {
  %scale: f32[] = const [0.35355339]
  %qr = Rope(%q, %cos, %sin) {rotary_dim = 4}
  %kr = Rope(%k, %cos, %sin) {rotary_dim = 4}
  %kt = Transpose(%kr) {perm = [0, 1, 3, 2]}
  %s = MatMul(%qr, %kt)
  %s1 = Mul(%s, %scale)
  %p = Softmax(%s1) {axis = -1}
  %o = MatMul(%p, %v)
  return %o
})";
  EXPECT_EQ(AttrInt(FusedAttentionAttrs(text), "rope_dim", 0), 4);
}

// GPT-J's RoPE: interleaved pairs over the first 4 of 8 values, applied to the [B,S,H,d] rows
// before the head split (tables [1,S,1,4]). Inside the kernel: no Rope kernel is left.
TEST(FuseAttention, InterleavedRotaryBeforeTheHeadSplitRunsInTheKernel) {
  const std::string text = R"(graph @gptj(%q: f32[1,6,2,8], %k: f32[1,6,2,8], %v: f32[1,2,6,8], %cos: f32[1,6,1,4], %sin: f32[1,6,1,4]) {
  %scale: f32[] = const [0.35355339]
  %qr = Rope(%q, %cos, %sin) {interleaved = 1, rotary_dim = 4}
  %kr = Rope(%k, %cos, %sin) {interleaved = 1, rotary_dim = 4}
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %kt = Transpose(%k4) {perm = [0, 1, 3, 2]}
  %s = MatMul(%q4, %kt)
  %s1 = Mul(%s, %scale)
  %p = Softmax(%s1) {axis = -1}
  %o = MatMul(%p, %v)
  return %o
})";
  const AttributeMap a = FusedAttentionAttrs(text);
  EXPECT_EQ(AttrInt(a, "rope_interleaved", 0), 1);
  EXPECT_EQ(AttrString(a, "rope_tables", ""), "bshd");
}

// A mask that differs across the batch keeps seq-first heads apart, with the reason.
TEST(FuseAttention, SeqFirstHeadsWithAPerBatchMaskStayApart) {
  auto g = ParseGraph(SeqFirstText(", %mask: f32[2,1,5,5]", "  %s2 = Add(%s1, %mask)\n"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  FusionReport report;
  PipelineOptions on;
  on.fusion_report = &report;
  ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), on).ok());
  EXPECT_EQ(CountOp(**g, "FusedAttention"), 0);
  bool refused = false;
  for (const auto& r : report.refusals)
    refused |= r.code == "attention-unsupported-layout" &&
               r.message.find("seq-first heads [S,B,H,d] stay apart: mask") != std::string::npos;
  EXPECT_TRUE(refused) << "no seq-first refusal";
}

// [B*H, S, d] heads given as they are (no transposes to absorb): read in place as bhsd, K^T as
// bhds, a [1, S, Sk] mask broadcast over the heads, the output left in [B*H, S, dv].
TEST(FuseAttention, MergedHeadsReadInPlaceMatchUnfused) {
  AttentionTextMatchesUnfused(R"(graph @bmm(%q: f32[6,4,3], %kt: f32[6,3,5], %v: f32[6,5,3], %mask: f32[1,4,5]) {
  %c: f32[] = const [0.5]
  %s = MatMul(%q, %kt)
  %s1 = Mul(%c, %s)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = 2}
  %o = MatMul(%p, %v)
  return %o
})",
                              1);
}

// Grouped-query attention's body as transformers exports it, from q [B, S, 4*4], k and v
// [B, S, 2*4] and the shape constants %qs, %ks, %ax, %ex, %rs, %os and the scale %c: heads split,
// Q and K roped, K and V repeated by repeat_kv (Unsqueeze, Expand, Reshape), the scores scaled
// after the product, a mask added, the heads merged.
constexpr char kGqaHeadsAndAttention[] = R"(  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %kr = Reshape(%k, %ks)
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %vr = Reshape(%v, %ks)
  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}
  %qe = Rope(%q4, %cos, %sin)
  %ke = Rope(%k4, %cos, %sin)
  %ku = Unsqueeze(%ke, %ax)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %vu = Unsqueeze(%v4, %ax)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
  %s = MatMul(%qe, %kt)
  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
  %o4 = MatMul(%p, %vh)
  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %os)
  return %out
})";

// Grouped-query attention as transformers exports it (LLaMA with num_key_value_heads 2 of 4
// heads): q, k and v split into heads, Q and K roped, K and V repeated by repeat_kv (Unsqueeze,
// Expand, Reshape), the scores scaled after the product, a mask added, the heads merged. One
// kernel: the node reads the two K / V heads where they lie (kv_heads = 2).
TEST(FuseAttention, GroupedQueryHeadsMatchUnfused) {
  const std::string text = R"(graph @gqa(%q: f32[2,5,16], %k: f32[2,5,8], %v: f32[2,5,8], %cos: f32[2,1,5,4], %sin: f32[2,1,5,4], %mask: f32[2,1,5,5]) {
  %qs: i64[4] = const [2, 5, 4, 4]
  %ks: i64[4] = const [2, 5, 2, 4]
  %ax: i64[1] = const [2]
  %ex: i64[5] = const [2, 2, 2, 5, 4]
  %rs: i64[4] = const [2, 4, 5, 4]
  %os: i64[3] = const [2, 5, 16]
  %c: f32[] = const [0.5]
)" + std::string(kGqaHeadsAndAttention);
  AttentionTextMatchesUnfused(text, 1);
  auto g = ParseGraph(text);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), {}).ok());
  const Node* att = FindOp(**g, "FusedAttention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->GetInt("kv_heads", -1), 2);
  EXPECT_EQ(att->GetInt("heads", -1), 4);
  EXPECT_EQ(att->input(1)->name(), "k");  // K read where it lies, [B, S, 2 heads * d]
}

// Grouped-query LLaMA / Qwen2 attention as transformers exports it, from x: (an RMSNorm,) q, k
// and v projections of unequal width (4 heads of 4, 2 K / V heads), with biases for Qwen2,
// RoPE on Q and K, repeat_kv, a mask. One kernel: the projected form with kv_heads = 2 reads x
// and W [16, 32] (q's 16 columns, k's 8, v's 8), the norm folded (rms_epsilon) before the
// biases. Against the unfused plan (prepared: packed heads), and the node alone (unprepared:
// the sgemm path) against its reference graph.
std::string GroupedProjectionText(int64_t seq, bool bias, bool norm) {
  std::mt19937 rng(static_cast<uint32_t>(seq * 4 + bias * 2 + norm));
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  auto constant = [&](const std::string& name, std::vector<int64_t> shape, float lo = 0.f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string t = StrCat("  %", name, ": f32", ShapeToString(shape), " = const [");
    for (int64_t i = 0; i < n; ++i) t += StrCat(i ? ", " : "", lo + u(rng));
    return t + "]\n";
  };
  std::string text = StrCat("graph @gqa_proj(%x: f32[2,", seq, ",16], %cos: f32[2,1,", seq, ",4], %sin: f32[2,1,", seq,
                            ",4], %mask: f32[2,1,", seq, ",", seq, "]) {\n");
  text += constant("wq", {16, 16}) + constant("wk", {16, 8}) + constant("wv", {16, 8}) + constant("g", {16}, 1.f);
  if (bias) text += constant("bq", {16}) + constant("bk", {8}) + constant("bv", {8});
  text += StrCat("  %qs: i64[4] = const [2, ", seq, ", 4, 4]\n  %ks: i64[4] = const [2, ", seq, ", 2, 4]\n",
                 "  %ax: i64[1] = const [2]\n  %ex: i64[5] = const [2, 2, 2, ", seq, ", 4]\n",
                 "  %rs: i64[4] = const [2, 4, ", seq, ", 4]\n  %os: i64[3] = const [2, ", seq, ", 16]\n",
                 "  %c: f32[] = const [0.5]\n");
  text += norm ? "  %y = RMSNorm(%x, %g) {axis = -1, epsilon = 0.05}\n" : "  %y = Identity(%x)\n";
  for (const char* p : {"q", "k", "v"})
    text += bias ? StrCat("  %p", p, " = MatMul(%y, %w", p, ")\n  %", p, " = Add(%p", p, ", %b", p, ")\n")
                 : StrCat("  %", p, " = MatMul(%y, %w", p, ")\n");
  return text + R"(  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %kr = Reshape(%k, %ks)
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %vr = Reshape(%v, %ks)
  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}
  %qe = Rope(%q4, %cos, %sin)
  %ke = Rope(%k4, %cos, %sin)
  %ku = Unsqueeze(%ke, %ax)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %vu = Unsqueeze(%v4, %ax)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
  %s = MatMul(%qe, %kt)
  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
  %o4 = MatMul(%p, %vh)
  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %os)
  return %out
})";
}

TEST(FuseAttention, GroupedQueryProjectionsMoveIntoTheAttention) {
  for (const int64_t seq : {int64_t{5}, int64_t{40}})
    for (const bool bias : {false, true})
      for (const bool norm : {false, true}) {
        SCOPED_TRACE(StrCat("seq ", seq, bias ? ", biases" : "", norm ? ", RMSNorm" : ""));
        const std::string text = GroupedProjectionText(seq, bias, norm);
        AttentionTextMatchesUnfused(text, 1);
        auto g = ParseGraph(text);
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), {}).ok());
        const Node* att = FindOp(**g, "FusedAttention");
        ASSERT_NE(att, nullptr);
        EXPECT_EQ(att->GetInt("qkv_proj", 0), 1);
        EXPECT_EQ(att->GetInt("kv_heads", -1), 2);
        EXPECT_EQ(att->GetInt("qkv_bias", 0), bias ? 1 : 0);
        EXPECT_EQ(att->attrs().count("rms_epsilon"), norm ? 1u : 0u);
        EXPECT_EQ(att->input(1)->shape(), (Shape{16, 32}));
      }
}

// The KV-cache form: K and V are the caches [B, KV, Sk, d] (here graph inputs, read in place
// as bhsd), repeated to the 4 query heads; 3 query rows over 7 keys.
TEST(FuseAttention, GroupedQueryHeadsOverACacheMatchUnfused) {
  AttentionTextMatchesUnfused(R"(graph @gqa_kv(%q: f32[1,3,16], %k: f32[1,2,7,4], %v: f32[1,2,7,4], %mask: f32[1,1,3,7]) {
  %qs: i64[4] = const [1, 3, 4, 4]
  %us: i64[5] = const [1, 2, 1, 7, 4]
  %ex: i64[5] = const [1, 2, 2, 7, 4]
  %rs: i64[4] = const [1, 4, 7, 4]
  %os: i64[3] = const [1, 3, 16]
  %c: f32[] = const [0.5]
  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %ku = Reshape(%k, %us)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %vu = Reshape(%v, %us)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
  %s = MatMul(%q4, %kt)
  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
  %o4 = MatMul(%p, %vh)
  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %os)
  return %out
})",
                              1);
}

// SDPA with a mask as graphfuse's ATen translation and the ONNX exporters write it: grouped
// K / V heads repeated, the scores scaled, an f32 mask of 0 / -inf added (transformers' bool
// mask through Where(mask, 0, -inf)), and, when `guard`, Where(IsNaN(P), 0, P) after the
// softmax. B = 2, H = 4 over 2 K / V heads of 8, S = Sk = `seq`.
std::string MaskedSdpaText(int64_t seq, bool guard) {
  std::string text = StrCat("graph @sdpa(%q: f32[2,", seq, ",32], %k: f32[2,", seq, ",16], %v: f32[2,", seq,
                            ",16], %mask: f32[2,1,", seq, ",", seq, "]) {\n");
  text += StrCat("  %qs: i64[4] = const [2, ", seq, ", 4, 8]\n  %ks: i64[4] = const [2, ", seq, ", 2, 8]\n",
                 "  %ax: i64[1] = const [2]\n  %ex: i64[5] = const [2, 2, 2, ", seq, ", 8]\n",
                 "  %rs: i64[4] = const [2, 4, ", seq, ", 8]\n  %os: i64[3] = const [2, ", seq, ", 32]\n",
                 "  %c: f32[] = const [0.35355339]\n  %zero: f32[] = const [0]\n");
  text += R"(  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %kr = Reshape(%k, %ks)
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %vr = Reshape(%v, %ks)
  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}
  %ku = Unsqueeze(%k4, %ax)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %vu = Unsqueeze(%v4, %ax)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
  %s = MatMul(%q4, %kt)
  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
)";
  text += guard ? "  %isn = IsNaN(%p)\n  %pg = Where(%isn, %zero, %p)\n  %o4 = MatMul(%pg, %vh)\n"
                : "  %o4 = MatMul(%p, %vh)\n";
  return text + R"(  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %os)
  return %out
})";
}

// A query row whose every key is masked to -inf is a softmax over -inf alone, NaN: left padding
// under a causal mask (the padded positions see no key), or a sequence padded everywhere.
// PyTorch's SDPA gives 0 there, and so does the guard Where(IsNaN(P), 0, P) that its exports and
// graphfuse's ATen translation write after the softmax. The guard fuses into the one attention
// kernel (zero_nan_rows), which then gives those rows 0 as the unfused plan does; without the
// guard both plans give NaN there. Every other row matches the unfused plan and float64, with
// and without the plan's prepared mask rows (a row block's keys left out).
TEST(FuseAttention, RowsMaskedEverywhereFollowTheSoftmaxNaNGuard) {
  constexpr int64_t kSeq = 13, kHeads = 4, kKv = 2, kD = 8;
  for (const bool causal : {true, false})
    for (const bool guard : {true, false}) {
      SCOPED_TRACE(StrCat(causal ? "causal + left padding" : "padding (batch 1 padded everywhere)",
                          guard ? ", guarded" : ", no guard"));
      const std::string text = MaskedSdpaText(kSeq, guard);
      auto unfused = ParseGraph(text);
      auto fused = ParseGraph(text);
      ASSERT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString();
      ASSERT_EQ(Formed(FuseAttention(**fused, FusionOptions{}, nullptr)), 1);
      EXPECT_EQ(CountKernels(**fused), 1) << PrintGraph(**fused);
      const Node* fa = FindOp(**fused, "FusedAttention");
      ASSERT_NE(fa, nullptr);
      EXPECT_EQ(fa->GetInt("zero_nan_rows", 0), guard ? 1 : 0);
      // Batch b's first pad[b] keys are padding; causal: key j > row r is masked too.
      const int64_t pad[2] = {3, causal ? 0 : kSeq};
      auto masked = [&](int64_t b, int64_t r, int64_t j) { return j < pad[b] || (causal && j > r); };
      const std::vector<Tensor> ins =
          RandomInputs(**unfused, 31, 0.05, 1.5, [&](const Value& v, int64_t i, std::mt19937&) -> std::optional<double> {
            if (v.name() != "mask") return std::nullopt;
            return masked(i / (kSeq * kSeq), i / kSeq % kSeq, i % kSeq) ? -INFINITY : 0.0;
          });
      ThreadPool pool(2);
      auto a = Execute(**unfused, Views(ins), CpuContext{&pool});
      auto b = Execute(**fused, Views(ins), CpuContext{&pool});
      ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
      EXPECT_TRUE(SameValues((*b)[0], RunUnprepared(**fused, ins, 2))) << "prepared vs unprepared";
      // float64, row by row: softmax(0.35355339 q.k + mask) v, or the guard's 0 (NaN without it).
      const float* q = ins[0].data_as<float>();
      const float* k = ins[1].data_as<float>();
      const float* v = ins[2].data_as<float>();
      int64_t dead_rows = 0;
      for (int64_t bb = 0; bb < 2; ++bb)
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t r = 0; r < kSeq; ++r) {
            const int64_t kh = h / (kHeads / kKv);
            std::vector<double> p(kSeq);
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < kSeq; ++j) {
              double dot = 0;
              for (int64_t c = 0; c < kD; ++c)
                dot += double(q[(bb * kSeq + r) * kHeads * kD + h * kD + c]) * k[(bb * kSeq + j) * kKv * kD + kh * kD + c];
              p[j] = masked(bb, r, j) ? -INFINITY : double(0.35355339f) * dot;
              m = std::max(m, p[j]);
            }
            const bool dead = m == -INFINITY;
            dead_rows += dead && h == 0;
            for (double& x : p) sum += (x = dead ? 0 : std::exp(x - m));
            for (int64_t c = 0; c < kD; ++c) {
              double want = 0;
              for (int64_t j = 0; j < kSeq; ++j) want += p[j] * v[(bb * kSeq + j) * kKv * kD + kh * kD + c];
              want = dead ? (guard ? 0.0 : NAN) : want / sum;
              const int64_t i = (bb * kSeq + r) * kHeads * kD + h * kD + c;
              const double got = (*b)[0].GetAsDouble(i), base = (*a)[0].GetAsDouble(i);
              if (std::isnan(want)) {
                EXPECT_TRUE(std::isnan(got) && std::isnan(base)) << "element " << i << ": fused " << got << ", unfused " << base;
                continue;
              }
              if (dead) {
                EXPECT_EQ(got, 0.0) << "element " << i << " (fused)";
                EXPECT_EQ(base, 0.0) << "element " << i << " (unfused)";
                continue;
              }
              EXPECT_NEAR(got, want, kAtol + kRtol * std::fabs(want)) << "element " << i << " vs float64";
              EXPECT_NEAR(got, base, kAtol + kRtol * std::fabs(base)) << "element " << i << " vs unfused";
            }
          }
      EXPECT_EQ(dead_rows, causal ? 3 : kSeq);  // the rows masked everywhere, per head
    }
}

// The guard fuses only as written: Where(IsNaN(P), 0, P) with nothing else reading IsNaN's
// result; a guard whose fill is not 0 stays outside, and the attention does not fuse.
TEST(FuseAttention, NaNGuardFusesOnlyWithAZeroFill) {
  std::string text = MaskedSdpaText(5, true);
  const std::string zero = "%zero: f32[] = const [0]";
  text.replace(text.find(zero), zero.size(), "%zero: f32[] = const [0.5]");
  auto g = ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Formed(FuseAttention(**g, FusionOptions{}, nullptr)), 0) << PrintGraph(**g);
}

}  // namespace
}  // namespace graphfuse
