// Canonicalize: decomposed RMSNorm / LayerNorm / GELU (erf, tanh) / SiLU / Softmax / RoPE written
// in textual IR the way exporters write them (opset 13 and 17 spellings, commuted operands) turn
// into single ops; near misses stay as they are. Every rewrite is run against the original graph
// on the same random inputs. Also: the Rope kernel against a float64 loop, and the exported
// models under tests/models.
#include "cpu/cpu_target.h"
#include "passes/fusion_passes.h"

#include <gtest/gtest.h>

#include "graph_test_util.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "graphfuse/thread_pool.h"
#include "ir/text.h"
#include "onnx/import.h"
#include "passes/fold_constants.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

constexpr double kUlp = 1.0 / (1 << 23);  // f32 ulp at 1.0

// Values of magnitude in [0.1, 2] with random sign: never zero, so relative checks mean something.
// How far the canonicalized graph may be from the decomposed one, per element:
// |a - b| <= atol + ulps * 2^-23 * max(|a|, |b|).
struct Tol {
  double ulps;
  double atol;
};

// Runs `before` and `after` on the same random inputs and checks every output within `tol`.
void ExpectSameResults(const Graph& before, const Graph& after, Tol tol, uint32_t seed = 7) {
  const std::vector<Tensor> ins = RandomInputs(before, seed, 0.1, 2.0);
  std::vector<TensorView> views;
  for (const Tensor& t : ins) views.push_back(t.view());
  ThreadPool pool(2);
  auto a = Execute(before, views, CpuContext{&pool});
  auto b = Execute(after, views, CpuContext{&pool});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->size(), b->size());
  for (size_t k = 0; k < a->size(); ++k) {
    ASSERT_EQ((*a)[k].numel(), (*b)[k].numel());
    double worst = 0;  // the largest error / allowed over the elements (NaN counts as infinite)
    int64_t worst_at = 0;
    for (int64_t i = 0; i < (*a)[k].numel(); ++i) {
      const double x = (*a)[k].GetAsDouble(i), y = (*b)[k].GetAsDouble(i);
      const double allowed = tol.atol + tol.ulps * kUlp * std::max(std::fabs(x), std::fabs(y));
      const double err = std::fabs(x - y);
      double ratio = err == 0 ? 0 : err / allowed;  // allowed == 0 and err > 0: infinite
      if (std::isnan(x) != std::isnan(y) || (std::isnan(err) && !std::isnan(x))) ratio = INFINITY;
      if (std::isnan(x) && std::isnan(y)) ratio = 0;
      if (ratio > worst) {
        worst = ratio;
        worst_at = i;
      }
    }
    EXPECT_LE(worst, 1.0) << "output " << k << " element " << worst_at << ": decomposed "
                          << (*a)[k].GetAsDouble(worst_at) << ", canonicalized " << (*b)[k].GetAsDouble(worst_at);
  }
}

// Parses `text` twice, canonicalizes one copy, expects `rewrites` patterns rewritten, a graph
// that verifies, the graph outputs' names kept, and results within `tol` of the original.
std::unique_ptr<Graph> CanonicalizeAndCompare(const std::string& text, int rewrites, Tol tol) {
  auto before = Parse(text);
  auto after = Parse(text);
  auto n = Canonicalize(*after);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n.ok() ? *n : -1, rewrites) << PrintGraph(*after);
  Status v = after->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString() << "\n" << PrintGraph(*after);
  EXPECT_EQ(before->outputs().size(), after->outputs().size());
  for (size_t k = 0; k < std::min(before->outputs().size(), after->outputs().size()); ++k)
    EXPECT_EQ(before->outputs()[k]->name(), after->outputs()[k]->name());
  ExpectSameResults(*before, *after, tol);
  return after;
}

// Parses and canonicalizes `text`, expecting nothing to change.
void ExpectUnchanged(const std::string& text) {
  auto g = Parse(text);
  const std::string printed = PrintGraph(*g);
  auto n = Canonicalize(*g);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0) << PrintGraph(*g);
  EXPECT_EQ(PrintGraph(*g), printed);
}

// Tolerances, from the rounding steps of each form (f32 ulp = 2^-23 relative at worst):
// RMSNorm: the decomposed graph rounds x^2, the mean, +eps, sqrt, 1/., x*inv and *w (7 steps of
//   half an ulp); the kernel sums squares in double and rounds inv once before x*inv*w. No
//   cancellation anywhere (all products), so 8 ulps relative covers the difference.
constexpr Tol kRmsTol{8, 0};
// LayerNorm: as RMSNorm for (x - mean) * inv * gamma, both subtracting the same f32 mean; the
//   final + beta may cancel, leaving an error of a few ulps of the terms (|d*inv*gamma| and
//   |beta| are O(1) here), hence the absolute part.
constexpr Tol kLayerNormTol{8, 8 * kUlp};
// GELU (erf): 1 + erf(z) cancels for z < 0 in the decomposed form, so its error is absolute:
//   erf's 4 ulps at |erf| ~ 1 plus the rounded argument, times |x|/2 <= 1: under 2^-21. The
//   Gelu op itself is within 4 ulps relative (computed with erfc).
constexpr Tol kGeluTol{8, 4 * kUlp};
// GELU (tanh): the same cancellation with tanh's 3 ulps and a longer argument chain (x^3, two
//   scalings, an add); the GeluTanh op's own contract is 16 ulps relative (ops.def).
constexpr Tol kGeluTanhTol{16, 4 * kUlp};
// SiLU: sigmoid's 3 ulps + the multiply against Silu's 3 ulps.
constexpr Tol kSiluTol{8, 0};
// Softmax: exp (2 ulps), the f32-rounded sum and the divide against the kernel's 1-ulp exp and
//   its own sum; all terms positive, so relative.
constexpr Tol kSoftmaxTol{8, 0};
// Rope computes (x*cos) + ((-x2)*sin) with the same f32 roundings as the Mul/Neg/Mul/Add ops.
constexpr Tol kBitExact{0, 0};

// ---- RMSNorm ----

TEST(Canonicalize, RmsNormAsExportedAtOpset13) {
  // torch: x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, exported with Div(1, Sqrt).
  auto g = CanonicalizeAndCompare(R"(graph @rms(%x: f32[2,8,64], %w: f32[64]) {
  %two: f32[] = const [2.0]
  %eps: f32[] = const [1e-6]
  %one: f32[] = const [1.0]
  %sq = Pow(%x, %two)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %rms = Sqrt(%s)
  %inv = Div(%one, %rms)
  %xn = Mul(%x, %inv)
  %y = Mul(%xn, %w)
  return %y
})",
                                  1, kRmsTol);
  ASSERT_EQ(g->num_nodes(), 1u);
  const Node* n = g->nodes().front().get();
  EXPECT_EQ(n->op(), "RMSNorm");
  EXPECT_EQ(n->inputs().size(), 2u);
  EXPECT_EQ(n->input(1)->name(), "w");
  EXPECT_FLOAT_EQ(n->GetFloat("epsilon", 0), 1e-6f);
  EXPECT_EQ(n->GetInt("axis", 0), -1);
  EXPECT_EQ(n->output()->name(), "y");
  EXPECT_EQ(n->GetString("canonicalized_from", ""), "Pow_0, ReduceMean_1, Add_2, Sqrt_3, Div_4, Mul_5, Mul_6");
  EXPECT_EQ(n->name(), "Mul_6_rmsnorm");
}

TEST(Canonicalize, RmsNormRsqrtCommutedAxesInput) {
  // Opset-18 style axes input, x*x, eps + mean, Rsqrt, inv * x, w * (.).
  auto g = CanonicalizeAndCompare(R"(graph @rms(%x: f32[4,32], %w: f32[32]) {
  %axes: i64[1] = const [1]
  %eps: f32[1] = const [1e-5]
  %sq = Mul(%x, %x)
  %mean = ReduceMean(%sq, %axes) {keepdims = 1}
  %s = Add(%eps, %mean)
  %inv = Rsqrt(%s)
  %xn = Mul(%inv, %x)
  %y = Mul(%w, %xn)
  return %y
})",
                                  1, kRmsTol);
  const Node* n = FindOp(*g, "RMSNorm");
  ASSERT_NE(n, nullptr);
  EXPECT_FLOAT_EQ(n->GetFloat("epsilon", 0), 1e-5f);
  EXPECT_EQ(n->inputs().size(), 2u);
}

TEST(Canonicalize, RmsNormDivAndReciprocalFormsWithoutWeight) {
  auto g = CanonicalizeAndCompare(R"(graph @rms(%x: f32[3,16], %z: f32[3,16]) {
  %two: f32[1] = const [2.0]
  %eps: f32[] = const [1e-6]
  %sq = Pow(%x, %two)
  %mean = ReduceMean(%sq) {axes = [-1]}
  %s = Add(%mean, %eps)
  %rms = Sqrt(%s)
  %a = Div(%x, %rms)
  %zsq = Mul(%z, %z)
  %zmean = ReduceMean(%zsq) {axes = [1], keepdims = 1}
  %zs = Add(%zmean, %eps)
  %zrms = Sqrt(%zs)
  %zinv = Reciprocal(%zrms)
  %b = Mul(%zinv, %z)
  return %a, %b
})",
                                  2, kRmsTol);
  EXPECT_EQ(CountOp(*g, "RMSNorm"), 2);
  EXPECT_EQ(g->num_nodes(), 2u);
  for (const auto& n : g->nodes()) EXPECT_EQ(n->inputs().size(), 1u) << n->name();
}

TEST(Canonicalize, RmsNormNotRewrittenWhenAnIntermediateIsReadOutside) {
  // The mean also feeds another op: removing the pattern would drop it.
  ExpectUnchanged(R"(graph @rms(%x: f32[2,64], %w: f32[64]) {
  %two: f32[] = const [2.0]
  %eps: f32[] = const [1e-6]
  %one: f32[] = const [1.0]
  %sq = Pow(%x, %two)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %rms = Sqrt(%s)
  %inv = Div(%one, %rms)
  %xn = Mul(%x, %inv)
  %y = Mul(%xn, %w)
  %m2 = Neg(%mean)
  return %y, %m2
})");
  // An intermediate that is a graph output.
  ExpectUnchanged(R"(graph @rms(%x: f32[2,64]) {
  %eps: f32[] = const [1e-6]
  %sq = Mul(%x, %x)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %inv = Rsqrt(%s)
  %y = Mul(%x, %inv)
  return %y, %inv
})");
}

TEST(Canonicalize, RmsNormNearMissesStay) {
  // Mean over the first axis, not the last.
  ExpectUnchanged(R"(graph @rms(%x: f32[8,8]) {
  %eps: f32[] = const [1e-6]
  %sq = Mul(%x, %x)
  %mean = ReduceMean(%sq) {axes = [0], keepdims = 1}
  %s = Add(%mean, %eps)
  %inv = Rsqrt(%s)
  %y = Mul(%x, %inv)
  return %y
})");
  // The square of one tensor normalizing another.
  ExpectUnchanged(R"(graph @rms(%x: f32[8,8], %z: f32[8,8]) {
  %eps: f32[] = const [1e-6]
  %sq = Mul(%z, %z)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %inv = Rsqrt(%s)
  %y = Mul(%x, %inv)
  return %y
})");
  // Pow(x, 2.001) is not a square.
  ExpectUnchanged(R"(graph @rms(%x: f32[8,8]) {
  %p: f32[] = const [2.001]
  %eps: f32[] = const [1e-6]
  %sq = Pow(%x, %p)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %inv = Rsqrt(%s)
  %y = Mul(%x, %inv)
  return %y
})");
}

// ---- LayerNorm ----

TEST(Canonicalize, LayerNormAsExportedAtOpset13) {
  auto g = CanonicalizeAndCompare(R"(graph @ln(%x: f32[2,8,64], %gamma: f32[64], %beta: f32[64]) {
  %two: f32[] = const [2.0]
  %eps: f32[] = const [1e-5]
  %mean = ReduceMean(%x) {axes = [-1]}
  %d = Sub(%x, %mean)
  %sq = Pow(%d, %two)
  %var = ReduceMean(%sq) {axes = [-1]}
  %s = Add(%var, %eps)
  %std = Sqrt(%s)
  %n = Div(%d, %std)
  %g = Mul(%n, %gamma)
  %y = Add(%g, %beta)
  return %y
})",
                                  1, kLayerNormTol);
  ASSERT_EQ(g->num_nodes(), 1u);
  const Node* n = g->nodes().front().get();
  EXPECT_EQ(n->op(), "LayerNormalization");
  ASSERT_EQ(n->inputs().size(), 3u);
  EXPECT_EQ(n->input(1)->name(), "gamma");
  EXPECT_EQ(n->input(2)->name(), "beta");
  EXPECT_FLOAT_EQ(n->GetFloat("epsilon", 0), 1e-5f);
  EXPECT_EQ(n->outputs().size(), 1u);
}

TEST(Canonicalize, LayerNormCommutedWithoutBeta) {
  auto g = CanonicalizeAndCompare(R"(graph @ln(%x: f32[4,48], %gamma: f32[48]) {
  %eps: f32[1] = const [1e-5]
  %mean = ReduceMean(%x) {axes = [1], keepdims = 1}
  %d = Sub(%x, %mean)
  %sq = Mul(%d, %d)
  %var = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%eps, %var)
  %inv = Rsqrt(%s)
  %n = Mul(%inv, %d)
  %y = Mul(%gamma, %n)
  return %y
})",
                                  1, kLayerNormTol);
  const Node* n = FindOp(*g, "LayerNormalization");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->inputs().size(), 2u);
  EXPECT_EQ(n->input(1)->name(), "gamma");
}

TEST(Canonicalize, LayerNormWithoutAffineGetsUnitScale) {
  auto g = CanonicalizeAndCompare(R"(graph @ln(%x: f32[4,48]) {
  %eps: f32[] = const [1e-5]
  %mean = ReduceMean(%x) {axes = [-1]}
  %d = Sub(%x, %mean)
  %sq = Mul(%d, %d)
  %var = ReduceMean(%sq) {axes = [-1]}
  %s = Add(%var, %eps)
  %std = Sqrt(%s)
  %y = Div(%d, %std)
  return %y
})",
                                  1, kLayerNormTol);
  const Node* n = FindOp(*g, "LayerNormalization");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->inputs().size(), 2u);
  ASSERT_NE(n->input(1)->constant(), nullptr);
  EXPECT_EQ(n->input(1)->shape(), (Shape{48}));
}

TEST(Canonicalize, LayerNormResidualAddIsNotBeta) {
  // The Add after the affine is a residual [4,48], not a beta: LayerNorm(x, gamma), then Add.
  auto g = CanonicalizeAndCompare(R"(graph @ln(%x: f32[4,48], %gamma: f32[48], %r: f32[4,48]) {
  %eps: f32[] = const [1e-5]
  %mean = ReduceMean(%x) {axes = [-1]}
  %d = Sub(%x, %mean)
  %sq = Mul(%d, %d)
  %var = ReduceMean(%sq) {axes = [-1]}
  %s = Add(%var, %eps)
  %std = Sqrt(%s)
  %n = Div(%d, %std)
  %g = Mul(%n, %gamma)
  %y = Add(%g, %r)
  return %y
})",
                                  1, kLayerNormTol);
  EXPECT_EQ(CountOp(*g, "LayerNormalization"), 1);
  EXPECT_EQ(CountOp(*g, "Add"), 1);
}

TEST(Canonicalize, LayerNormCentredOnAnotherMeanIsAnRmsNorm) {
  // x - mean(z) is not centred, so this is no LayerNorm; it is an RMSNorm of d = x - mean(z).
  auto g = CanonicalizeAndCompare(R"(graph @ln(%x: f32[4,48], %z: f32[4,48]) {
  %eps: f32[] = const [1e-5]
  %mean = ReduceMean(%z) {axes = [-1]}
  %d = Sub(%x, %mean)
  %sq = Mul(%d, %d)
  %var = ReduceMean(%sq) {axes = [-1]}
  %s = Add(%var, %eps)
  %std = Sqrt(%s)
  %y = Div(%d, %std)
  return %y
})",
                                  1, kRmsTol);
  EXPECT_EQ(CountOp(*g, "LayerNormalization"), 0);
  EXPECT_EQ(CountOp(*g, "RMSNorm"), 1);
  EXPECT_EQ(CountOp(*g, "Sub"), 1);
}

// ---- GELU ----

TEST(Canonicalize, GeluErfAsExported) {
  // nn.GELU(): x * (1 + erf(x / sqrt2)) * 0.5.
  auto g = CanonicalizeAndCompare(R"(graph @gelu(%x: f32[16,64]) {
  %sqrt2: f32[] = const [1.4142135381698608]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %z = Div(%x, %sqrt2)
  %e = Erf(%z)
  %a = Add(%e, %one)
  %m = Mul(%x, %a)
  %y = Mul(%m, %half)
  return %y
})",
                                  1, kGeluTol);
  ASSERT_EQ(g->num_nodes(), 1u);
  EXPECT_EQ(g->nodes().front()->op(), "Gelu");
  EXPECT_EQ(g->nodes().front()->input(0)->name(), "x");
}

TEST(Canonicalize, GeluErfHalfFirstAndMulByInverseSqrt2) {
  auto g = CanonicalizeAndCompare(R"(graph @gelu(%x: f32[3,100]) {
  %c: f32[1] = const [0.70710678]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %h = Mul(%half, %x)
  %z = Mul(%c, %x)
  %e = Erf(%z)
  %a = Add(%one, %e)
  %y = Mul(%a, %h)
  return %y
})",
                                  1, kGeluTol);
  EXPECT_EQ(CountOp(*g, "Gelu"), 1);
  EXPECT_EQ(g->num_nodes(), 1u);
}

TEST(Canonicalize, GeluWithWrongConstantStays) {
  ExpectUnchanged(R"(graph @gelu(%x: f32[16,64]) {
  %sqrt2: f32[] = const [1.4142135]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5001]
  %z = Div(%x, %sqrt2)
  %e = Erf(%z)
  %a = Add(%e, %one)
  %m = Mul(%x, %a)
  %y = Mul(%m, %half)
  return %y
})");
  // Erf of x / 2 is not GELU.
  ExpectUnchanged(R"(graph @gelu(%x: f32[16,64]) {
  %two: f32[] = const [2.0]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %z = Div(%x, %two)
  %e = Erf(%z)
  %a = Add(%e, %one)
  %m = Mul(%x, %a)
  %y = Mul(%m, %half)
  return %y
})");
}

TEST(Canonicalize, GeluInsideALargerProductIsFoundAtItsOwnRoot) {
  // gelu(x) * u: the outer product has four factors; the GELU subtree is still rewritten.
  auto g = CanonicalizeAndCompare(R"(graph @geglu(%x: f32[8,64], %u: f32[8,64]) {
  %sqrt2: f32[] = const [1.4142135]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %z = Div(%x, %sqrt2)
  %e = Erf(%z)
  %a = Add(%e, %one)
  %m = Mul(%x, %a)
  %g = Mul(%m, %half)
  %y = Mul(%g, %u)
  return %y
})",
                                  1, kGeluTol);
  EXPECT_EQ(CountOp(*g, "Gelu"), 1);
  EXPECT_EQ(CountOp(*g, "Mul"), 1);
}

TEST(Canonicalize, GeluTanhWithPowBecomesGeluTanhNeverGelu) {
  auto g = CanonicalizeAndCompare(R"(graph @gelu(%x: f32[16,64]) {
  %three: f32[] = const [3.0]
  %k: f32[] = const [0.044715]
  %b: f32[] = const [0.7978845608]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %c = Pow(%x, %three)
  %kc = Mul(%k, %c)
  %in = Add(%x, %kc)
  %u = Mul(%b, %in)
  %t = Tanh(%u)
  %a = Add(%one, %t)
  %h = Mul(%half, %x)
  %y = Mul(%h, %a)
  return %y
})",
                                  1, kGeluTanhTol);
  EXPECT_EQ(CountOp(*g, "GeluTanh"), 1);
  EXPECT_EQ(CountOp(*g, "Gelu"), 0);
  EXPECT_EQ(g->num_nodes(), 1u);
}

TEST(Canonicalize, GeluTanhAsTorchExportsIt) {
  // torch's symbolic: half * (x * (one + Tanh(beta * (x + kappa * (x * (x * x)))))).
  auto g = CanonicalizeAndCompare(R"(graph @gelu(%x: f32[4,256]) {
  %k: f32[] = const [0.044715]
  %b: f32[] = const [0.7978845608028654]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %xx = Mul(%x, %x)
  %c = Mul(%x, %xx)
  %kc = Mul(%k, %c)
  %in = Add(%kc, %x)
  %u = Mul(%in, %b)
  %t = Tanh(%u)
  %a = Add(%t, %one)
  %xa = Mul(%x, %a)
  %y = Mul(%half, %xa)
  return %y
})",
                                  1, kGeluTanhTol);
  EXPECT_EQ(CountOp(*g, "GeluTanh"), 1);
  EXPECT_EQ(CountOp(*g, "Gelu"), 0);
}

TEST(Canonicalize, GeluTanhWithWrongCubicCoefficientStays) {
  ExpectUnchanged(R"(graph @gelu(%x: f32[16,64]) {
  %three: f32[] = const [3.0]
  %k: f32[] = const [0.0447]
  %b: f32[] = const [0.7978845608]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %c = Pow(%x, %three)
  %kc = Mul(%k, %c)
  %in = Add(%x, %kc)
  %u = Mul(%b, %in)
  %t = Tanh(%u)
  %a = Add(%one, %t)
  %h = Mul(%half, %x)
  %y = Mul(%h, %a)
  return %y
})");
}

// ---- SiLU ----

TEST(Canonicalize, SiluBothOrders) {
  auto g = CanonicalizeAndCompare(R"(graph @silu(%x: f32[8,100], %z: f32[8,100]) {
  %s = Sigmoid(%x)
  %a = Mul(%x, %s)
  %t = Sigmoid(%z)
  %b = Mul(%t, %z)
  %y = Mul(%a, %b)
  return %y
})",
                                  2, kSiluTol);
  EXPECT_EQ(CountOp(*g, "Silu"), 2);
  EXPECT_EQ(CountOp(*g, "Sigmoid"), 0);
}

TEST(Canonicalize, SiluWhoseSigmoidIsAlsoReadStays) {
  ExpectUnchanged(R"(graph @silu(%x: f32[8,100]) {
  %s = Sigmoid(%x)
  %a = Mul(%x, %s)
  return %a, %s
})");
  ExpectUnchanged(R"(graph @silu(%x: f32[8,100], %z: f32[8,100]) {
  %s = Sigmoid(%z)
  %a = Mul(%x, %s)
  return %a
})");
}

// ---- Softmax ----

TEST(Canonicalize, SoftmaxWrittenOut) {
  // ReduceMax with the axes attribute, ReduceSum with the axes input (opset 13).
  auto g = CanonicalizeAndCompare(R"(graph @sm(%x: f32[2,4,16,33]) {
  %axes: i64[1] = const [-1]
  %m = ReduceMax(%x) {axes = [3], keepdims = 1}
  %d = Sub(%x, %m)
  %e = Exp(%d)
  %s = ReduceSum(%e, %axes) {keepdims = 1}
  %y = Div(%e, %s)
  return %y
})",
                                  1, kSoftmaxTol);
  ASSERT_EQ(g->num_nodes(), 1u);
  EXPECT_EQ(g->nodes().front()->op(), "Softmax");
  EXPECT_EQ(g->nodes().front()->GetInt("axis", 0), -1);
}

TEST(Canonicalize, SoftmaxWithoutMaxSubtractionStays) {
  ExpectUnchanged(R"(graph @sm(%x: f32[4,16]) {
  %axes: i64[1] = const [-1]
  %e = Exp(%x)
  %s = ReduceSum(%e, %axes) {keepdims = 1}
  %y = Div(%e, %s)
  return %y
})");
  // The exponentials also leave the pattern.
  ExpectUnchanged(R"(graph @sm(%x: f32[4,16]) {
  %axes: i64[1] = const [-1]
  %m = ReduceMax(%x) {axes = [-1], keepdims = 1}
  %d = Sub(%x, %m)
  %e = Exp(%d)
  %s = ReduceSum(%e, %axes) {keepdims = 1}
  %y = Div(%e, %s)
  return %y, %e
})");
}

// ---- Transposes written through a 3-D view ----

// The dynamo exporter's K^T: Reshape to [B*H, T, d], Transpose(0,2,1), Reshape to [B,H,d,T];
// and GQA's repeated heads [B,KV,R,T,d] viewed as [B*H,T,d] and back as [B,H,d,T]. Each becomes
// one Transpose of the last two dims (of a [B,H,T,d] view of the repeated heads), bit-exact.
TEST(Canonicalize, TransposeThroughA3DViewIsOneTranspose) {
  auto g = CanonicalizeAndCompare(R"(graph @kt(%k: f32[2,4,8,16]) {
  %s3: i64[3] = const [8, 8, 16]
  %s4: i64[4] = const [2, 4, 16, 8]
  %r = Reshape(%k, %s3)
  %t = Transpose(%r) {perm = [0, 2, 1]}
  %y = Reshape(%t, %s4)
  return %y
})",
                                  1, Tol{0, 0});
  ASSERT_EQ(g->num_nodes(), 1u);
  EXPECT_EQ(g->nodes().front()->op(), "Transpose");
  EXPECT_EQ(g->nodes().front()->GetInts("perm"), (std::vector<int64_t>{0, 1, 3, 2}));
  auto gqa = CanonicalizeAndCompare(R"(graph @kt(%k: f32[1,2,2,8,16]) {
  %s3: i64[3] = const [4, 8, 16]
  %s4: i64[4] = const [1, 4, 16, 8]
  %r = Reshape(%k, %s3)
  %t = Transpose(%r) {perm = [0, 2, 1]}
  %y = Reshape(%t, %s4)
  return %y
})",
                                    1, Tol{0, 0});
  ASSERT_EQ(gqa->num_nodes(), 2u);
  EXPECT_EQ(gqa->nodes().front()->op(), "Reshape");
  EXPECT_EQ(gqa->nodes().front()->output()->shape(), (Shape{1, 4, 8, 16}));
  EXPECT_EQ(gqa->nodes().back()->GetInts("perm"), (std::vector<int64_t>{0, 1, 3, 2}));
}

// The dynamo exporter's unpacking of nn.MultiheadAttention's packed projection [S,B,3E]:
// Reshape to [S,B,3,E], Unsqueeze, Transpose, Squeeze, Gather q / k / v, each viewed as
// [S,B*H,d], transposed to [B*H,S,d] and viewed as [B,H,S,d] (K^T: one Transpose more). Each
// becomes Slice(columns) -> Reshape [S,B,H,d] -> Transpose, bit-exact.
TEST(Canonicalize, PackedProjectionUnpackedByGathersBecomesSlices) {
  auto g = CanonicalizeAndCompare(R"(graph @unpack(%p: f32[5,2,24]) {
  %s4: i64[4] = const [5, 2, 3, 8]
  %ax0: i64[1] = const [0]
  %ax3: i64[1] = const [3]
  %i0: i64[] = const [0]
  %i1: i64[] = const [1]
  %i2: i64[] = const [2]
  %s3: i64[3] = const [5, 4, 4]
  %sh: i64[4] = const [2, 2, 5, 4]
  %skt: i64[4] = const [2, 2, 4, 5]
  %v = Reshape(%p, %s4)
  %u = Unsqueeze(%v, %ax0)
  %t = Transpose(%u) {perm = [3, 1, 2, 0, 4]}
  %sq = Squeeze(%t, %ax3)
  %q = Gather(%sq, %i0) {axis = 0}
  %k = Gather(%sq, %i1) {axis = 0}
  %w = Gather(%sq, %i2) {axis = 0}
  %q3 = Reshape(%q, %s3)
  %qt = Transpose(%q3) {perm = [1, 0, 2]}
  %q4 = Reshape(%qt, %sh)
  %k3 = Reshape(%k, %s3)
  %kt = Transpose(%k3) {perm = [1, 0, 2]}
  %ktt = Transpose(%kt) {perm = [0, 2, 1]}
  %k4 = Reshape(%ktt, %skt)
  %w3 = Reshape(%w, %s3)
  %wt = Transpose(%w3) {perm = [1, 0, 2]}
  %w4 = Reshape(%wt, %sh)
  return %q4, %k4, %w4
})",
                                  3, Tol{0, 0});
  std::map<std::string, int> ops;
  for (const auto& n : g->nodes()) ++ops[n->op()];
  EXPECT_EQ(ops["Slice"], 3) << PrintGraph(*g);
  EXPECT_EQ(ops["Reshape"], 3) << PrintGraph(*g);
  EXPECT_EQ(ops["Transpose"], 3) << PrintGraph(*g);
  EXPECT_EQ(ops["Gather"] + ops["Squeeze"] + ops["Unsqueeze"], 0) << PrintGraph(*g);
  for (const auto& n : g->nodes()) {
    if (n->is(op::Transpose) && n->output()->name() == "k4") {
      EXPECT_EQ(n->GetInts("perm"), (std::vector<int64_t>{1, 2, 3, 0}));
    }
  }
}

// A Gather whose indices pick non-contiguous columns (a stride-2 pick) is not a Slice: unchanged.
TEST(Canonicalize, GatherChainThatIsNotAColumnRangeStays) {
  ExpectUnchanged(R"(graph @pick(%p: f32[5,8]) {
  %s3: i64[3] = const [5, 4, 2]
  %i1: i64[] = const [1]
  %v = Reshape(%p, %s3)
  %g = Gather(%v, %i1) {axis = 2}
  return %g
})");
}

TEST(Canonicalize, TransposeThroughA3DViewStaysWhenItIsNotASwap) {
  // The middle value is read elsewhere too.
  ExpectUnchanged(R"(graph @kt(%k: f32[2,4,8,16]) {
  %s3: i64[3] = const [8, 8, 16]
  %s4: i64[4] = const [2, 4, 16, 8]
  %r = Reshape(%k, %s3)
  %t = Transpose(%r) {perm = [0, 2, 1]}
  %y = Reshape(%t, %s4)
  return %y, %t
})");
  // The outer view mixes the swapped dims with the leading ones.
  ExpectUnchanged(R"(graph @kt(%k: f32[2,4,8,16]) {
  %s3: i64[3] = const [8, 8, 16]
  %s4: i64[4] = const [2, 4, 8, 16]
  %r = Reshape(%k, %s3)
  %t = Transpose(%r) {perm = [0, 2, 1]}
  %y = Reshape(%t, %s4)
  return %y
})");
}

// ---- RoPE ----

// rotate_half with the given Slice bounds / Concat order, as the exporter writes it.
std::string RopeText(const std::string& mul_cos, const std::string& mul_sin, const std::string& add,
                     const std::string& lo_end = "8", const std::string& concat = "%neg, %lo") {
  return R"(graph @rope(%x: f32[2,4,16,16], %cos: f32[1,1,16,16], %sin: f32[1,1,16,16]) {
  %axis: i64[1] = const [3]
  %maxis: i64[1] = const [-1]
  %zero: i64[1] = const [0]
  %half: i64[1] = const [)" + lo_end + R"(]
  %big: i64[1] = const [1000000]
  %step: i64[1] = const [1]
  %xc = )" + mul_cos + R"(
  %lo = Slice(%x, %zero, %half, %axis, %step)
  %hi = Slice(%x, %half, %big, %maxis)
  %neg = Neg(%hi)
  %rot = Concat()" + concat + R"() {axis = -1}
  %rs = )" + mul_sin + R"(
  %y = )" + add + R"(
  return %y
})";
}

TEST(Canonicalize, RopeRotateHalfIsBitExact) {
  auto g = CanonicalizeAndCompare(RopeText("Mul(%x, %cos)", "Mul(%rot, %sin)", "Add(%xc, %rs)"), 1, kBitExact);
  ASSERT_EQ(g->num_nodes(), 1u);
  const Node* n = g->nodes().front().get();
  EXPECT_EQ(n->op(), "Rope");
  ASSERT_EQ(n->inputs().size(), 3u);
  EXPECT_EQ(n->input(0)->name(), "x");
  EXPECT_EQ(n->input(1)->name(), "cos");
  EXPECT_EQ(n->input(2)->name(), "sin");
}

// Partial rotary as GPT-NeoX and Phi write it: the first 8 of 16 values rotated (rotate-half of
// 8), the other 8 concatenated after them. One Rope with rotary_dim 8, bit-exact.
TEST(Canonicalize, PartialRotaryIsOneRope) {
  auto g = CanonicalizeAndCompare(R"(graph @partial(%x: f32[2,4,16,16], %cos: f32[1,1,16,8], %sin: f32[1,1,16,8]) {
  %maxis: i64[1] = const [-1]
  %zero: i64[1] = const [0]
  %four: i64[1] = const [4]
  %eight: i64[1] = const [8]
  %big: i64[1] = const [1000000]
  %xr = Slice(%x, %zero, %eight, %maxis)
  %xp = Slice(%x, %eight, %big, %maxis)
  %lo = Slice(%xr, %zero, %four, %maxis)
  %hi = Slice(%xr, %four, %big, %maxis)
  %neg = Neg(%hi)
  %rot = Concat(%neg, %lo) {axis = -1}
  %xc = Mul(%xr, %cos)
  %rs = Mul(%rot, %sin)
  %yr = Add(%xc, %rs)
  %y = Concat(%yr, %xp) {axis = -1}
  return %y
})",
                                  2, kBitExact);
  ASSERT_EQ(g->num_nodes(), 1u) << PrintGraph(*g);
  EXPECT_EQ(g->nodes().front()->op(), "Rope");
  EXPECT_EQ(g->nodes().front()->GetInt("rotary_dim", 0), 8);
}

// GPT-J's rotate_every_two: the pairs (-x[2i+1], x[2i]) stacked on a new last axis and viewed
// back, times tables holding each angle twice. One interleaved Rope, bit-exact.
TEST(Canonicalize, InterleavedRotaryIsOneRope) {
  auto g = CanonicalizeAndCompare(R"(graph @every_two(%x: f32[1,6,4,8], %cos: f32[1,6,1,8], %sin: f32[1,6,1,8]) {
  %maxis: i64[1] = const [-1]
  %zero: i64[1] = const [0]
  %one: i64[1] = const [1]
  %two: i64[1] = const [2]
  %big: i64[1] = const [1000000]
  %shape: i64[4] = const [1, 6, 4, 8]
  %even = Slice(%x, %zero, %big, %maxis, %two)
  %odd = Slice(%x, %one, %big, %maxis, %two)
  %neg = Neg(%odd)
  %u0 = Unsqueeze(%neg, %maxis)
  %u1 = Unsqueeze(%even, %maxis)
  %stack = Concat(%u0, %u1) {axis = -1}
  %rot = Reshape(%stack, %shape)
  %xc = Mul(%x, %cos)
  %rs = Mul(%rot, %sin)
  %y = Add(%xc, %rs)
  return %y
})",
                                  1, kBitExact);
  ASSERT_EQ(g->num_nodes(), 1u) << PrintGraph(*g);
  EXPECT_EQ(g->nodes().front()->op(), "Rope");
  EXPECT_EQ(g->nodes().front()->GetInt("interleaved", 0), 1);
}

TEST(Canonicalize, RopeCommutedOperands) {
  auto g = CanonicalizeAndCompare(RopeText("Mul(%cos, %x)", "Mul(%sin, %rot)", "Add(%rs, %xc)"), 1, kBitExact);
  EXPECT_EQ(CountOp(*g, "Rope"), 1);
}

TEST(Canonicalize, RopeNearMissesStay) {
  // Halves in the other order: a rotation the other way, not rotate_half.
  ExpectUnchanged(RopeText("Mul(%x, %cos)", "Mul(%rot, %sin)", "Add(%xc, %rs)", "8", "%lo, %neg"));
  // Split off-centre.
  ExpectUnchanged(RopeText("Mul(%x, %cos)", "Mul(%rot, %sin)", "Add(%xc, %rs)", "7"));
  // cos multiplies a different tensor.
  ExpectUnchanged(R"(graph @rope(%x: f32[4,16], %z: f32[4,16], %cos: f32[4,16], %sin: f32[4,16]) {
  %axis: i64[1] = const [-1]
  %zero: i64[1] = const [0]
  %half: i64[1] = const [8]
  %end: i64[1] = const [16]
  %xc = Mul(%z, %cos)
  %lo = Slice(%x, %zero, %half, %axis)
  %hi = Slice(%x, %half, %end, %axis)
  %neg = Neg(%hi)
  %rot = Concat(%neg, %lo) {axis = 1}
  %rs = Mul(%rot, %sin)
  %y = Add(%xc, %rs)
  return %y
})");
}

// ---- the Rope op ----

// Rope on x [2,3,5,d] with cos/sin of `table` shape, against a float64 loop: the result is the
// f32 expression (x*c) + ((-x2)*s) exactly, and within 1 ulp of the magnitudes of the float64 value.
void CheckRopeKernel(DType dtype, const Shape& table, int64_t d) {
  const Shape xs{2, 3, 5, d};
  Graph g;
  Value* x = g.AddInput("x", dtype, xs).value();
  Value* c = g.AddInput("cos", dtype, table).value();
  Value* s = g.AddInput("sin", dtype, table).value();
  auto n = g.AddNode("Rope", {x, c, s});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_TRUE(g.MarkOutput((*n)->output()).ok());
  const std::vector<Tensor> ins = RandomInputs(g, 11, 0.1, 2.0);
  std::vector<TensorView> views;
  for (const Tensor& t : ins) views.push_back(t.view());
  ThreadPool pool(3);
  auto out = Execute(g, views, CpuContext{&pool});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& y = (*out)[0];
  const std::vector<int64_t> st = BroadcastStrides(table, xs);
  const int64_t h = d / 2;
  for (int64_t i = 0; i < y.numel(); ++i) {
    int64_t rest = i, off = 0;
    for (size_t k = xs.size(); k-- > 0;) {
      off += (rest % xs[k]) * st[k];
      rest /= xs[k];
    }
    const int64_t j = i % d;
    const double xv = ins[0].GetAsDouble(i);
    const double rot = j < h ? -ins[0].GetAsDouble(i + h) : ins[0].GetAsDouble(i - h);
    const double cv = ins[1].GetAsDouble(off), sv = ins[2].GetAsDouble(off);
    const double ref = xv * cv + rot * sv;
    const double mag = std::fabs(xv * cv) + std::fabs(rot * sv);
    // Each product rounded to f32 on its own (volatile keeps the compiler from fusing a*b+c).
    volatile float p = static_cast<float>(xv) * static_cast<float>(cv);
    volatile float q = static_cast<float>(rot) * static_cast<float>(sv);
    const float f32 = p + q;
    if (dtype == DType::kF32) {
      ASSERT_EQ(static_cast<float>(y.GetAsDouble(i)), f32) << "element " << i;
      // Two products and a sum, each half an ulp of its magnitude.
      ASSERT_LE(std::fabs(y.GetAsDouble(i) - ref), 1.5 * kUlp * mag) << "element " << i;
    } else {
      // One rounding to the 16-bit type on store (f16: 2^-11, bf16: 2^-8 relative) after the f32 work.
      const double unit = dtype == DType::kF16 ? 1.0 / 2048 : 1.0 / 256;
      ASSERT_LE(std::fabs(y.GetAsDouble(i) - ref), unit * std::fabs(ref) + 1.5 * kUlp * mag + 1e-7) << "element " << i;
    }
  }
}

TEST(RopeKernel, MatchesFloat64LoopWithBroadcastTables) {
  CheckRopeKernel(DType::kF32, {5, 64}, 64);        // [S, d] against [B, H, S, d]
  CheckRopeKernel(DType::kF32, {1, 1, 5, 16}, 16);  // the exporter's [1, 1, S, d]
  CheckRopeKernel(DType::kF32, {2, 3, 5, 6}, 6);    // full shape, d not a vector multiple
  CheckRopeKernel(DType::kF32, {5, 1}, 10);         // one angle per row, broadcast along d
  CheckRopeKernel(DType::kF16, {5, 32}, 32);
  CheckRopeKernel(DType::kBF16, {5, 32}, 32);
}

TEST(RopeKernel, RefusesBadShapesNamingTheOp) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {2, 7}).value();
  Value* c7 = g.AddInput("c7", DType::kF32, {2, 7}).value();
  Value* c8 = g.AddInput("c8", DType::kF32, {3, 8}).value();
  Value* x8 = g.AddInput("x8", DType::kF32, {2, 8}).value();
  Value* h8 = g.AddInput("h8", DType::kF16, {8}).value();
  Value* i8 = g.AddInput("i8", DType::kI32, {2, 8}).value();
  auto odd = g.AddNode("Rope", {x, c7, c7}, {}, "r_odd");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("Rope"), std::string::npos) << odd.status().ToString();
  EXPECT_NE(odd.status().message().find("f32[2,7]"), std::string::npos) << odd.status().ToString();
  auto bcast = g.AddNode("Rope", {x8, c8, c8}, {}, "r_bcast");
  ASSERT_FALSE(bcast.ok());
  EXPECT_NE(bcast.status().message().find("[3,8]"), std::string::npos) << bcast.status().ToString();
  auto dtype = g.AddNode("Rope", {x8, h8, h8}, {}, "r_dtype");
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.status().message().find("f16"), std::string::npos) << dtype.status().ToString();
  EXPECT_FALSE(g.AddNode("Rope", {i8, i8, i8}, {}, "r_int").ok());
  EXPECT_FALSE(g.AddNode("Rope", {x8, x8}, {}, "r_two").ok());
}

// ---- CanonicalizeViews ----

// Parses `text` twice, runs CanonicalizeViews on one copy; expects a graph that verifies with
// the outputs' names kept, none of `gone` left, and results within `tol` of the original.
std::unique_ptr<Graph> ViewsAndCompare(const std::string& text, const std::vector<std::string>& gone, Tol tol) {
  auto before = Parse(text);
  auto after = Parse(text);
  auto n = CanonicalizeViews(*after);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_GT(n.ok() ? *n : 0, 0) << "nothing rewritten\n" << PrintGraph(*after);
  const Status v = after->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString() << "\n" << PrintGraph(*after);
  EXPECT_EQ(before->outputs().size(), after->outputs().size());
  for (size_t k = 0; k < std::min(before->outputs().size(), after->outputs().size()); ++k)
    EXPECT_EQ(before->outputs()[k]->name(), after->outputs()[k]->name());
  for (size_t k = 0; k < std::min(before->inputs().size(), after->inputs().size()); ++k)
    EXPECT_EQ(before->inputs()[k]->name(), after->inputs()[k]->name());
  for (const std::string& op : gone) EXPECT_EQ(CountOp(*after, op), 0) << op << " left in\n" << PrintGraph(*after);
  ExpectSameResults(*before, *after, tol);
  return after;
}

// A constant's line of IR text: `count` values (i * 37 % 17 - 8) / 16 + offset, no two
// neighbours equal, none zero for offset 1/32.
std::string ConstLine(const std::string& name, const std::string& shape, int count) {
  std::string line = "  %" + name + ": f32" + shape + " = const [";
  for (int i = 0; i < count; ++i) line += StrCat(i ? ", " : "", (i * 37 % 17 - 8) / 16.0 + 1.0 / 32);
  return line + "]\n";
}

// A projection of other columns, or rows viewed otherwise, sums the same K products in the same
// order; only a BLAS blocking that differs with N could round differently.
constexpr Tol kViewTol{4, 1e-6};

// Two Conv1D layers (view, addmm, view) with an activation between them and a residual after:
// the views go, and the full pipeline then runs each GEMM with its bias, the activation and the
// residual as its epilogue: two kernels (six unfused).
const std::string kConv1DMlp = "graph @mlp(%x: f32[2,3,8]) {\n" + ConstLine("w1", "[8,16]", 128) +
                                ConstLine("b1", "[16]", 16) + ConstLine("w2", "[16,8]", 128) + ConstLine("b2", "[8]", 8) +
                                R"(  %flat1: i64[2] = const [-1, 8]
  %rows1: i64[3] = const [2, 3, 16]
  %flat2: i64[2] = const [-1, 16]
  %rows2: i64[3] = const [2, 3, 8]
  %x2 = Reshape(%x, %flat1)
  %p1 = MatMul(%x2, %w1)
  %a1 = Add(%b1, %p1)
  %h = Reshape(%a1, %rows1)
  %t = Tanh(%h)
  %t2 = Reshape(%t, %flat2)
  %p2 = MatMul(%t2, %w2)
  %a2 = Add(%p2, %b2)
  %o = Reshape(%a2, %rows2)
  %y = Add(%o, %x)
  return %y
})";

TEST(CanonicalizeViews, Conv1DLayersLoseTheirViews) {
  ViewsAndCompare(kConv1DMlp, {"Reshape"}, kViewTol);
}

TEST(CanonicalizeViews, Conv1DLayersThenFuseIntoTwoGemms) {
  auto unfused = Parse(kConv1DMlp);
  auto fused = Parse(kConv1DMlp);
  PipelineOptions off, on;
  off.fusion.enabled = false;
  ASSERT_TRUE(RunPipeline(*unfused, cpu::DefaultCpuTarget(), off).ok());
  FusionReport report;
  on.fusion_report = &report;
  ASSERT_TRUE(RunPipeline(*fused, cpu::DefaultCpuTarget(), on).ok());
  EXPECT_EQ(report.kernels_before, 6);
  EXPECT_EQ(report.kernels_after, 2) << PrintGraph(*fused);
  EXPECT_EQ(CountOp(*fused, "FusedGemm"), 2);
  for (const FusedGroupInfo& gi : report.groups) EXPECT_EQ(gi.kind, "gemm_epilogue");
  for (const FusionRefusal& r : report.refusals)
    EXPECT_EQ(r.message.find("Reshape"), std::string::npos) << "no view is in the way: " << r.message;
  ExpectSameResults(*unfused, *fused, Tol{16, 1e-6});
}

TEST(CanonicalizeViews, SplitOfABiasedProjectionMatches) {
  auto g = ViewsAndCompare("graph @qkv(%x: f32[2,5,4]) {\n" + ConstLine("w", "[4,12]", 48) +
                               ConstLine("b", "[1,1,12]", 12) + R"(  %sizes: i64[3] = const [4, 4, 4]
  %p = MatMul(%x, %w)
  %y = Add(%p, %b)
  %q, %k, %v = Split(%y, %sizes) {axis = -1}
  %s = Mul(%q, %k)
  %z = Sub(%s, %v)
  return %z, %k
})",
                           {"Split", "Slice"}, kViewTol);
  EXPECT_EQ(CountOp(*g, "MatMul"), 3);
}

TEST(CanonicalizeViews, SlicesWithClampedBoundsMatch) {
  // Two ranges of one width, one given with a negative start and an end past the dim (ONNX
  // clamps it), and a range between them that nothing reads.
  auto g = ViewsAndCompare("graph @parts(%x: f32[3,4]) {\n" + ConstLine("w", "[4,6]", 24) + R"(  %s0: i64[1] = const [0]
  %s2: i64[1] = const [2]
  %m2: i64[1] = const [-2]
  %big: i64[1] = const [100]
  %ax: i64[1] = const [1]
  %p = MatMul(%x, %w)
  %a = Slice(%p, %s0, %s2, %ax)
  %b = Slice(%p, %m2, %big, %ax)
  %c = Slice(%p, %s2, %m2, %ax)
  return %a, %b
})",
                           {"Slice"}, kViewTol);
  EXPECT_EQ(CountOp(*g, "MatMul"), 2);
}

TEST(CanonicalizeViews, LeavesWhatIsNotAView) {
  // Row-broadcast operands only: a [6,1] operand broadcasts along the last dim, which the view
  // would change; a view that splits the last dim; slices of a non-constant projection; slices
  // of two widths (FuseGemm would not join them again).
  const std::string text = "graph @keep(%a: f32[6,4], %c: f32[6,1], %x: f32[6,4], %w: f32[4,4]) {\n" +
                           ConstLine("wc", "[4,6]", 24) + R"(  %shape: i64[3] = const [2, 3, 4]
  %heads: i64[3] = const [6, 2, 2]
  %s0: i64[1] = const [0]
  %s2: i64[1] = const [2]
  %s6: i64[1] = const [6]
  %last: i64[1] = const [-1]
  %s = Add(%a, %c)
  %y = Reshape(%s, %shape)
  %e = Exp(%a)
  %h = Reshape(%e, %heads)
  %p = MatMul(%x, %w)
  %q = Slice(%p, %s0, %s2, %last)
  %pc = MatMul(%x, %wc)
  %u = Slice(%pc, %s0, %s2, %last)
  %t = Slice(%pc, %s2, %s6, %last)
  return %y, %h, %q, %u, %t
})";
  auto g = Parse(text);
  const std::string printed = PrintGraph(*g);
  auto n = CanonicalizeViews(*g);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0) << PrintGraph(*g);
  EXPECT_EQ(PrintGraph(*g), printed);
}

// ---- the exported models ----

std::string ModelsDir() {
  if (const char* p = std::getenv("GF_MODELS_DIR")) return p;
  return std::string(GF_MODELS_DIR);
}

struct ModelExpectation {
  const char* dir;
  int rewrites;
  std::vector<std::pair<const char*, int>> counts;  // op -> count after canonicalization
};

TEST(Canonicalize, ExportedModels) {
  const std::vector<std::string> gone = {"Pow", "ReduceMean", "Sqrt", "Erf", "Sigmoid", "Neg", "Slice", "Concat"};
  const std::vector<ModelExpectation> models = {
      {"llama_block_opset13", 5, {{"RMSNorm", 2}, {"Rope", 2}, {"Silu", 1}, {"Softmax", 1}}},
      {"llama_block_opset17", 5, {{"RMSNorm", 2}, {"Rope", 2}, {"Silu", 1}, {"Softmax", 1}}},
      {"attention_layernorm_opset13", 1, {{"LayerNormalization", 1}, {"Softmax", 1}}},
      {"attention_layernorm_opset17", 0, {{"LayerNormalization", 1}, {"Softmax", 1}}},  // LN exported as one op
      {"mlp_gelu_opset13", 1, {{"Gelu", 1}}},
      {"mlp_gelu_opset17", 1, {{"Gelu", 1}}},
  };
  int found = 0;
  for (const ModelExpectation& m : models) {
    const std::string path = ModelsDir() + "/" + m.dir + "/model.onnx";
    if (!std::filesystem::exists(path)) continue;
    ++found;
    SCOPED_TRACE(m.dir);
    auto before = ImportOnnxFile(path);
    auto after = ImportOnnxFile(path);
    ASSERT_TRUE(before.ok() && after.ok()) << before.status().ToString();
    Graph& g = **after;
    ASSERT_TRUE(FoldConstants(g, FoldOptions{&cpu::DefaultCpuTarget()}).ok());
    auto n = Canonicalize(g);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, m.rewrites) << PrintGraph(g);
    const Status v = g.Verify();
    EXPECT_TRUE(v.ok()) << v.ToString();
    for (const auto& [op, count] : m.counts) EXPECT_EQ(CountOp(g, op), count) << op;
    for (const std::string& op : gone) EXPECT_EQ(CountOp(g, op), 0) << op << " left in\n" << PrintGraph(g);
    EXPECT_EQ(g.outputs()[0]->name(), (*before)->outputs()[0]->name());
    // The norms and activations change roundings, not values: a few ulps each, carried through
    // the block's 64- and 172-wide dot products of O(1) values.
    ExpectSameResults(**before, g, Tol{16, 16 * kUlp});
  }
  if (found == 0) GTEST_SKIP() << "no models under " << ModelsDir() << " (set GF_MODELS_DIR)";
}

TEST(Canonicalize, ExportedModelNodeNamesAndProvenance) {
  const std::string path = ModelsDir() + "/llama_block_opset17/model.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
  auto g = ImportOnnxFile(path);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(FoldConstants(**g, FoldOptions{&cpu::DefaultCpuTarget()}).ok());
  ASSERT_TRUE(Canonicalize(**g).ok());
  std::map<std::string, const Node*> by_name;
  for (const auto& n : (*g)->nodes()) by_name[n->name()] = n.get();
  ASSERT_TRUE(by_name.count("/input_norm/RMSNorm"));
  ASSERT_TRUE(by_name.count("/post_norm/RMSNorm"));
  ASSERT_TRUE(by_name.count("/Add_rope"));
  ASSERT_TRUE(by_name.count("/Add_1_rope"));
  EXPECT_EQ(by_name["/input_norm/RMSNorm"]->GetString("canonicalized_from", ""),
            "/input_norm/Pow, /input_norm/ReduceMean, /input_norm/Add, /input_norm/Sqrt, /input_norm/Div, "
            "/input_norm/Mul, /input_norm/Mul_1");
  EXPECT_EQ(by_name["/input_norm/RMSNorm"]->output()->name(), "/input_norm/Mul_1_output_0");
  EXPECT_EQ(by_name["/Add_rope"]->GetString("canonicalized_from", ""),
            "/Mul, /Slice, /Slice_1, /Neg, /Concat, /Mul_1, /Add");
  EXPECT_EQ(by_name["/Add_rope"]->input(1)->name(), "cos");
}

}  // namespace
}  // namespace graphfuse
