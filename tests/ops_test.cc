// Every row of the op table, run through the public call path (one launch) and checked
// against the float64 reference: boundary sizes, special values, broadcasting, in-place, dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>

#include "cpu/elementwise_kernels.h"
#include "cpu/tile_program.h"
#include "test_util.h"

namespace graphfuse {
namespace {

using testing::ExpectMatchesReference;
using testing::FillRandom;

struct Case {
  OpKind op;
  DType dtype;  // data dtype
};

std::string CaseName(const ::testing::TestParamInfo<Case>& p) {
  return std::string(OpName(p.param.op)) + "_" + DTypeName(p.param.dtype);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const OpInfo& op : AllOps()) {
    if (op.cls == OpClass::kLogical) {
      cases.push_back({op.kind, DType::kBool});
      continue;
    }
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) cases.push_back({op.kind, t});
    if (op.int_ok)
      for (DType t : {DType::kI32, DType::kI64}) cases.push_back({op.kind, t});
  }
  return cases;
}

// The dtypes of each input for a data dtype (Where's condition is bool).
std::vector<DType> InputDTypes(const Case& c) {
  const OpInfo& info = GetOpInfo(c.op);
  std::vector<DType> t(info.arity, c.dtype);
  if (info.cls == OpClass::kSelect) t[0] = DType::kBool;
  return t;
}

OpAttrs AttrsFor(OpKind op) {
  OpAttrs a = DefaultAttrs(op);
  if (op == OpKind::kClip) a.alpha = -1.5f, a.beta = 2.25f;
  if (op == OpKind::kScale) a.alpha = 0.3f;
  if (op == OpKind::kDropout) a.alpha = 0.25f, a.training = true, a.seed = 1234;
  if (op == OpKind::kCast) a.to = DType::kF32;
  return a;
}

class OpTest : public ::testing::TestWithParam<Case> {
 protected:
  // Runs the op on random inputs of the given shapes and checks every element.
  void RunAndCheck(const std::vector<Shape>& shapes, const CpuContext& ctx, const std::string& where,
                   uint32_t seed = 7) {
    const Case c = GetParam();
    std::mt19937 rng(seed);
    const std::vector<DType> dts = InputDTypes(c);
    std::vector<Tensor> in;
    std::vector<TensorView> views;
    for (size_t k = 0; k < shapes.size(); ++k) {
      in.push_back(Tensor::Empty(dts[k], shapes[k]).value());
      FillRandom(in.back(), c.op, static_cast<int>(k), rng);
    }
    for (auto& t : in) views.push_back(t.view());
    auto out = RunOp(c.op, views, AttrsFor(c.op), ctx);
    ASSERT_TRUE(out.ok()) << where << ": " << out.status().ToString();
    ExpectMatchesReference(c.op, views, *out, AttrsFor(c.op), where);
  }
};

TEST_P(OpTest, BoundarySizes) {
  const int w = cpu::VectorLanes();
  const int64_t tile = cpu::kTileElements;
  const int arity = GetOpInfo(GetParam().op).arity;
  CpuContext serial;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{w - 1}, int64_t{w}, int64_t{w + 1}, int64_t{2 * w + 3},
                    tile - 1, tile, tile + 1, 3 * tile + 5}) {
    RunAndCheck(std::vector<Shape>(arity, Shape{n}), serial, "n=" + std::to_string(n));
  }
}

TEST_P(OpTest, LargeMultiThreaded) {
  ThreadPool pool(2);
  CpuContext ctx{&pool, 2, /*min_work_per_thread=*/1024};
  const int arity = GetOpInfo(GetParam().op).arity;
  RunAndCheck(std::vector<Shape>(arity, Shape{100003}), ctx, "n=100003, 2 threads");
}

// Ops with two or more inputs.
class BroadcastTest : public OpTest {};

TEST_P(BroadcastTest, Shapes) {
  const int arity = GetOpInfo(GetParam().op).arity;
  const OpKind op = GetParam().op;
  ThreadPool pool(2);
  CpuContext ctx{&pool, 2, 512};
  auto shapes = [&](Shape a, Shape b, Shape c) {
    std::vector<Shape> s{a, b, c};
    s.resize(arity);
    return s;
  };
  if (op == OpKind::kBias) {
    RunAndCheck({{37, 65}, {65}}, ctx, "bias [65]");
    RunAndCheck({{3, 5, 4096}, {4096}}, ctx, "bias [4096]");
    return;
  }
  RunAndCheck(shapes({67, 33}, {}, {67, 33}), ctx, "scalar rank 0");
  RunAndCheck(shapes({67, 33}, {1}, {1, 1}), ctx, "scalar [1]");
  RunAndCheck(shapes({67, 33}, {33}, {67, 33}), ctx, "per-column [C]");
  RunAndCheck(shapes({67, 33}, {1, 33}, {33}), ctx, "[1,C]");
  RunAndCheck(shapes({67, 1}, {1, 33}, {67, 33}), ctx, "outer product [R,1] x [1,C]");
  RunAndCheck(shapes({2, 1, 5, 7}, {3, 1, 7}, {7}), ctx, "rank expansion [2,1,5,7] x [3,1,7]");
  RunAndCheck(shapes({4, 1, 300}, {4, 9, 1}, {1}), ctx, "[B,1,S] x [B,T,1]");
  RunAndCheck(shapes({1}, {2049}, {2049}), ctx, "x broadcast, y contiguous");
}

// Cases whose output dtype and shape equal one of the inputs'.
class InPlaceTest : public OpTest {};

TEST_P(InPlaceTest, IntoAnInput) {
  const Case c = GetParam();
  const OpInfo& info = GetOpInfo(c.op);
  const std::vector<DType> dts = InputDTypes(c);
  const OpAttrs attrs = AttrsFor(c.op);
  std::vector<Shape> shapes(info.arity, Shape{5, 1001});
  if (c.op == OpKind::kBias) shapes[1] = {1001};
  std::mt19937 rng(11);
  std::vector<Tensor> in, copy;
  for (size_t k = 0; k < shapes.size(); ++k) {
    in.push_back(Tensor::Empty(dts[k], shapes[k]).value());
    FillRandom(in.back(), c.op, static_cast<int>(k), rng);
    copy.push_back(Tensor::Empty(dts[k], shapes[k]).value());
    std::memcpy(copy.back().data(), in.back().data(), in.back().nbytes());
  }
  std::vector<DType> out_dt;
  auto dt = InferDType(c.op, dts, attrs);
  ASSERT_TRUE(dt.ok());
  // Write into the last input whose dtype and shape equal the output's.
  int target = -1;
  for (size_t k = 0; k < in.size(); ++k)
    if (dts[k] == *dt && shapes[k] == shapes[0]) target = static_cast<int>(k);
  ASSERT_GE(target, 0) << "the case list only holds ops that can run in place";
  std::vector<TensorView> views, copy_views;
  for (auto& t : in) views.push_back(t.view());
  for (auto& t : copy) copy_views.push_back(t.view());
  ThreadPool pool(2);
  ASSERT_TRUE(RunOp(c.op, views, views[target], attrs, CpuContext{&pool, 2, 512}).ok());
  ExpectMatchesReference(c.op, copy_views, in[target], attrs, "in place into input " + std::to_string(target));
}

template <class Pred>
std::vector<Case> CasesWhere(Pred keep) {
  std::vector<Case> out;
  for (const Case& c : AllCases())
    if (keep(c)) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTest, ::testing::ValuesIn(AllCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(AllOps, BroadcastTest,
                         ::testing::ValuesIn(CasesWhere([](const Case& c) { return GetOpInfo(c.op).arity >= 2; })),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(AllOps, InPlaceTest, ::testing::ValuesIn(CasesWhere([](const Case& c) {
                           const std::vector<DType> in = InputDTypes(c);
                           auto out = InferDType(c.op, in, AttrsFor(c.op));
                           return out.ok() && std::find(in.begin(), in.end(), *out) != in.end();
                         })),
                         CaseName);

// ---- special values: +-0, +-inf, NaN, denormals, extremes --------------------------------

const float kSpecials[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, FLT_MIN, -FLT_MIN,
                           FLT_MAX, -FLT_MAX, 1.f, -1.f, 0.5f, -2.5f, 88.8f, -104.f, 10.f, -10.f};

class SpecialValueTest : public ::testing::TestWithParam<OpKind> {};

TEST_P(SpecialValueTest, F32) {
  const OpKind op = GetParam();
  const OpInfo& info = GetOpInfo(op);
  const int ns = static_cast<int>(std::size(kSpecials));
  // Every combination of specials across the inputs (Where's condition cycles 0/1).
  int64_t n = 1;
  for (int k = 0; k < info.arity; ++k) n *= ns;
  std::vector<Tensor> in;
  for (int k = 0; k < info.arity; ++k) {
    const bool cond = info.cls == OpClass::kSelect && k == 0;
    in.push_back(Tensor::Empty(cond ? DType::kBool : DType::kF32, {n}).value());
  }
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = i;
    for (int k = info.arity; k-- > 0; r /= ns)
      in[k].SetFromDouble(i, in[k].dtype() == DType::kBool ? double(r % 2) : double(kSpecials[r % ns]));
  }
  std::vector<TensorView> views;
  for (auto& t : in) views.push_back(t.view());
  const OpAttrs attrs = AttrsFor(op);
  auto out = RunOp(op, views, attrs, CpuContext{});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectMatchesReference(op, views, *out, attrs, "special values");
}

// Every op on float data (the logical ops take bool only; their exhaustive 0/1 cases are the
// boundary tests above).
std::vector<OpKind> FloatKinds() {
  std::vector<OpKind> k;
  for (const OpInfo& op : AllOps())
    if (op.cls != OpClass::kLogical) k.push_back(op.kind);
  return k;
}

INSTANTIATE_TEST_SUITE_P(AllOps, SpecialValueTest, ::testing::ValuesIn(FloatKinds()),
                         [](const auto& p) { return std::string(OpName(p.param)); });

// ---- accuracy sweeps of the transcendental activations -----------------------------------

// Dense sweep over the range where activations are used; reports the worst ulp error seen.
TEST(Accuracy, ActivationSweep) {
  for (OpKind op : {OpKind::kGelu, OpKind::kGeluTanh, OpKind::kSilu, OpKind::kSigmoid, OpKind::kTanh,
                    OpKind::kErf, OpKind::kExp, OpKind::kSoftplus, OpKind::kElu}) {
    const int64_t n = 200001;
    Tensor x = Tensor::Empty(DType::kF32, {n}).value();
    for (int64_t i = 0; i < n; ++i) x.data_as<float>()[i] = static_cast<float>(-10.0 + 20.0 * i / (n - 1));
    TensorView v = x.view();
    auto out = RunOp(op, {&v, 1}, DefaultAttrs(op), CpuContext{});
    ASSERT_TRUE(out.ok());
    const double worst = testing::ExpectMatchesReference(op, {&v, 1}, *out, DefaultAttrs(op), "sweep [-10,10]");
    RecordProperty(std::string(OpName(op)) + "_max_ulp", std::to_string(worst));
    std::printf("  %-10s max error over [-10, 10] beyond 1-ulp input slack: %.2f ulp (contract %d)\n",
                OpName(op), worst, GetOpInfo(op).max_ulp);
  }
}

// The trigonometric and hyperbolic rows over their domains, densely, against the float64
// reference: Tan across several poles, Sinh / Cosh up to where f32 overflows (past SLEEF's
// range), Asinh / Acosh up to 1e30 (past SLEEF's range, where C's functions take over).
TEST(Accuracy, TrigonometricSweep) {
  struct Sweep {
    OpKind op;
    double lo, hi;
    bool log_spaced;
  };
  for (const Sweep& s : {Sweep{OpKind::kTan, -10, 10, false}, Sweep{OpKind::kAtan, -1e4, 1e4, false},
                         Sweep{OpKind::kAsin, -1, 1, false}, Sweep{OpKind::kAcos, -1, 1, false},
                         Sweep{OpKind::kAtanh, -1, 1, false}, Sweep{OpKind::kSinh, -95, 95, false},
                         Sweep{OpKind::kCosh, -95, 95, false}, Sweep{OpKind::kAsinh, 1e-30, 1e30, true},
                         Sweep{OpKind::kAcosh, 1, 1e30, true}}) {
    const int64_t n = 200001;
    Tensor x = Tensor::Empty(DType::kF32, {n}).value();
    for (int64_t i = 0; i < n; ++i) {
      const double t = static_cast<double>(i) / (n - 1);
      const double v = s.log_spaced ? s.lo * std::pow(s.hi / s.lo, t) : s.lo + (s.hi - s.lo) * t;
      x.data_as<float>()[i] = static_cast<float>(v);
    }
    TensorView v = x.view();
    auto out = RunOp(s.op, {&v, 1}, DefaultAttrs(s.op), CpuContext{});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const double worst = testing::ExpectMatchesReference(s.op, {&v, 1}, *out, DefaultAttrs(s.op), "sweep");
    std::printf("  %-6s max error over [%g, %g] beyond 1-ulp input slack: %.2f ulp (contract %d)\n", OpName(s.op),
                s.lo, s.hi, worst, GetOpInfo(s.op).max_ulp);
  }
  // Past the end of SLEEF's range sinh is still finite (e^88.8 / 2 < FLT_MAX): C's sinh gives it.
  Tensor big = Tensor::FromFloats(DType::kF32, {4}, {88.8f, -88.9f, 89.4f, 3e19f}).value();
  TensorView bv = big.view();
  auto sinh = RunOp(OpKind::kSinh, {&bv, 1}, DefaultAttrs(OpKind::kSinh), CpuContext{});
  ASSERT_TRUE(sinh.ok());
  EXPECT_TRUE(std::isfinite(sinh->data_as<float>()[0]) && std::isfinite(sinh->data_as<float>()[1]));
  EXPECT_NEAR(sinh->data_as<float>()[0] / std::sinh(static_cast<double>(88.8f)), 1.0, 1e-6);
  auto asinh = RunOp(OpKind::kAsinh, {&bv, 1}, DefaultAttrs(OpKind::kAsinh), CpuContext{});
  ASSERT_TRUE(asinh.ok());
  EXPECT_NEAR(asinh->data_as<float>()[3], std::asinh(3e19), 1e-5);
}

// The vector exp (the Exp row; on AVX-512 and AVX2 also exp_fast and exp_softmax: Silu,
// Sigmoid, Softplus, softmax, attention) against the correctly rounded result, with no input
// slack: every 61st f32 bit pattern (70 M inputs over the whole range, subnormal results
// included) within 1 ulp; below -104 exactly +0; the specials exact. exp_softmax has its own
// test too (Kernels.SoftmaxExpUnderflowsToPlusZeroAndStaysAccurate).
TEST(Accuracy, ExpEveryFewFloatsWithinOneUlp) {
  const int64_t chunk = 1 << 22, stride = 61;
  Tensor x = Tensor::Empty(DType::kF32, {chunk}).value();
  int64_t checked = 0, worst = 0;
  float worst_at = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += static_cast<uint64_t>(chunk * stride)) {
    float* xs = x.data_as<float>();
    for (int64_t i = 0; i < chunk; ++i) {
      const uint32_t bits = static_cast<uint32_t>(base + static_cast<uint64_t>(i * stride));
      std::memcpy(&xs[i], &bits, 4);
    }
    TensorView v = x.view();
    auto out = RunOp(OpKind::kExp, {&v, 1}, DefaultAttrs(OpKind::kExp), CpuContext{});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const float* ys = out->data_as<float>();
    for (int64_t i = 0; i < chunk; ++i) {
      const float xi = xs[i], y = ys[i];
      if (std::isnan(xi)) {
        ASSERT_TRUE(std::isnan(y)) << "exp(NaN) = " << y;
        continue;
      }
      const float ref = static_cast<float>(std::exp(static_cast<double>(xi)));
      if (xi <= -104.f) {
        uint32_t b;
        std::memcpy(&b, &y, 4);
        ASSERT_EQ(b, 0u) << "exp(" << xi << ") must be +0, got " << y;
      }
      if (std::isinf(ref)) {
        ASSERT_EQ(y, ref) << "exp(" << xi << ")";
        continue;
      }
      ASSERT_TRUE(std::isfinite(y)) << "exp(" << xi << ") = " << y << ", expected " << ref;
      const int64_t d = std::abs(testing::FloatOrdinal(y) - testing::FloatOrdinal(ref));
      if (d > worst) worst = d, worst_at = xi;
      ++checked;
    }
  }
  EXPECT_LE(worst, 1) << "worst at x = " << worst_at;
  EXPECT_GT(checked, 50000000);  // the rest are NaN or overflow to inf
  std::printf("  exp: %lld inputs, worst %lld ulp (at %g)\n", static_cast<long long>(checked),
              static_cast<long long>(worst), worst_at);
  const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, 88.72f, 88.73f, -103.9f, -87.3f, -100.f};
  Tensor sx = Tensor::Empty(DType::kF32, {9}).value();
  std::memcpy(sx.data(), specials, sizeof specials);
  TensorView sv = sx.view();
  auto so = RunOp(OpKind::kExp, {&sv, 1}, DefaultAttrs(OpKind::kExp), CpuContext{});
  ASSERT_TRUE(so.ok());
  const float* y = so->data_as<float>();
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], 1.f);
  EXPECT_EQ(y[2], INFINITY);
  EXPECT_EQ(y[3], 0.f);
  for (int i = 4; i < 9; ++i)
    EXPECT_LE(std::abs(testing::FloatOrdinal(y[i]) - testing::FloatOrdinal(static_cast<float>(std::exp(static_cast<double>(specials[i]))))), 1)
        << "exp(" << specials[i] << ") = " << y[i];
}

// ---- dropout: the mask depends only on (seed, index) ------------------------------------

TEST(Dropout, InferenceIsIdentity) {
  Tensor x = Tensor::Empty(DType::kF32, {1000}).value();
  std::mt19937 rng(3);
  FillRandom(x, OpKind::kDropout, 0, rng);
  TensorView v = x.view();
  auto out = RunOp(OpKind::kDropout, {&v, 1}, DefaultAttrs(OpKind::kDropout), CpuContext{});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(0, std::memcmp(out->data(), x.data(), x.nbytes()));
}

TEST(Dropout, MaskIsIndependentOfThreadsAndKeepsOneMinusP) {
  const int64_t n = 1 << 20;
  Tensor x = Tensor::Empty(DType::kF32, {n}).value();
  for (int64_t i = 0; i < n; ++i) x.data_as<float>()[i] = 1.f;
  TensorView v = x.view();
  OpAttrs a = DefaultAttrs(OpKind::kDropout);
  a.training = true, a.alpha = 0.3f, a.seed = 42;
  ThreadPool pool(2);
  auto one = RunOp(OpKind::kDropout, {&v, 1}, a, CpuContext{});
  auto two = RunOp(OpKind::kDropout, {&v, 1}, a, CpuContext{&pool, 2, 1});
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(0, std::memcmp(one->data(), two->data(), one->nbytes()));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) kept += one->data_as<float>()[i] != 0.f;
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.003);
  a.seed = 43;
  auto other = RunOp(OpKind::kDropout, {&v, 1}, a, CpuContext{});
  ASSERT_TRUE(other.ok());
  EXPECT_NE(0, std::memcmp(one->data(), other->data(), one->nbytes()));
}

}  // namespace
}  // namespace graphfuse
