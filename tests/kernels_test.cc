// The non-elementwise kernels (src/cpu/kernels/): every op against a float64 reference written
// here, ONNX edge semantics (negative axes / steps / indices, clamping, keepdims, defaults), the
// threaded paths, and the errors inference gives for malformed nodes.
#include <gtest/gtest.h>

#include <climits>
#include <limits>
#include <cstring>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/graph.h"
#include "graphfuse/thread_pool.h"
#include "cpu/elementwise_kernels.h"
#include "cpu/simd.h"
#include "cpu/kernels/norm_rows.h"
#include "cpu/kernel_registry.h"
#include "ir/op_registry.h"
#include "cpu/executor.h"
#include "test_util.h"

namespace graphfuse {
namespace {

using Vec = std::vector<double>;

Tensor MakeTensor(DType t, const Shape& shape, const Vec& values) {
  Tensor x = Tensor::Empty(t, shape).value();
  EXPECT_EQ(static_cast<int64_t>(values.size()), x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) x.SetFromDouble(i, values[i]);
  return x;
}

Vec Iota(int64_t n, double start = 0) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}

Vec RandomVec(int64_t n, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(d(rng));  // exactly representable in f32
  return v;
}

Vec Values(const Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.GetAsDouble(i);
  return v;
}

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Builds a one-node graph, infers its outputs through the registry, and runs the op's kernel
// (a view op copies its input's bytes, as the executor's aliasing would show them).
class OneNode {
 public:
  Value* Input(Tensor t) {
    auto v = g_.AddInput(g_.FreshName("in"), t.dtype(), t.shape());
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    data_.push_back(std::make_shared<Tensor>(std::move(t)));
    values_.push_back(*v);
    return *v;
  }
  Value* Const(Tensor t) {
    auto v = g_.AddConstant(g_.FreshName("c"), std::make_shared<const Tensor>(std::move(t)));
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    data_.push_back(nullptr);
    values_.push_back(*v);
    return *v;
  }
  Value* ConstI64(const std::vector<int64_t>& v) {
    Vec d(v.begin(), v.end());
    return Const(MakeTensor(DType::kI64, {static_cast<int64_t>(v.size())}, d));
  }

  // Adds the node; inputs are the values made so far unless given (nullptr = omitted).
  Result<Node*> Add(const std::string& op, AttributeMap attrs = {}, int num_outputs = -1,
                    std::vector<Value*> inputs = {}) {
    if (inputs.empty()) inputs = values_;
    return g_.AddNode(op, inputs, std::move(attrs), "", num_outputs);
  }

  Result<std::vector<Tensor>> Run(Node* n, const CpuContext& cpu = CpuContext{}) {
    const OpSchema* s = FindSchema(n->op());
    if (!s) return NotFound("no schema for ", n->op());
    std::vector<TensorView> in;
    for (Value* v : n->inputs()) {
      if (!v) {
        in.push_back(TensorView{});
      } else if (v->constant()) {
        in.push_back(v->constant()->view());
      } else {
        size_t k = 0;
        while (values_[k] != v) ++k;
        in.push_back(data_[k]->view());
      }
    }
    std::vector<Tensor> outs;
    std::vector<TensorView> out_views;
    for (Value* o : n->outputs()) outs.push_back(Tensor::Empty(o->dtype(), o->shape()).value());
    for (Tensor& t : outs) out_views.push_back(t.view());
    if (s->view) {
      EXPECT_EQ(FindCpuKernel(n->op()), nullptr);
      EXPECT_EQ(Numel(in[0].shape), outs[0].numel());
      std::memcpy(outs[0].data(), in[0].data, outs[0].nbytes());
      return outs;
    }
    const CpuKernel* k = FindCpuKernel(n->op());
    if (!k) return NotFound("no CPU kernel for ", n->op());
    GF_RETURN_IF_ERROR(k->run(KernelContext{*n, in, out_views, cpu}));
    return outs;
  }

  // Add + Run, failing the test on any error.
  std::vector<Tensor> AddRun(const std::string& op, AttributeMap attrs = {}, int num_outputs = -1,
                             const CpuContext& cpu = CpuContext{}) {
    auto n = Add(op, std::move(attrs), num_outputs);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return {};
    auto r = Run(*n, cpu);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : std::vector<Tensor>{};
  }

  Graph& graph() { return g_; }

 private:
  Graph g_;
  std::vector<std::shared_ptr<Tensor>> data_;
  std::vector<Value*> values_;
};

void ExpectNear(const Vec& got, const Vec& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = (std::isnan(want[i]) && std::isnan(got[i])) || got[i] == want[i] ||
                    std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
  }
}

void ExpectShape(const Tensor& t, const Shape& s) { EXPECT_EQ(ShapeToString(t.shape()), ShapeToString(s)); }

// A context that splits every launch over 2 threads, to exercise the parallel paths.
struct Threaded {
  ThreadPool pool{2};
  CpuContext cpu{&pool, 0, 1};
};

std::string ErrorOf(const Result<Node*>& r) { return r.ok() ? std::string("<ok>") : r.status().message(); }
bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ------------------------------------------------------------------ MatMul / Gemm

// numpy.matmul in double, with batch broadcasting and 1-D promotion; also returns sum |a||b|
// per output element as the scale of the rounding error.
void RefMatMul(const Vec& a, Shape as, const Vec& b, Shape bs, Vec& out, Vec& scale) {
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as = {1, as[0]};
  if (b1) bs = {bs[0], 1};
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const size_t rank = std::max(as.size(), bs.size());
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  ab.insert(ab.begin(), rank - as.size(), 1);
  bb.insert(bb.begin(), rank - bs.size(), 1);
  Shape batch(rank - 2);
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = std::max(ab[i], bb[i]);
  const int64_t nb = Numel(batch);
  out.assign(static_cast<size_t>(nb * m * n), 0);
  scale.assign(out.size(), 0);
  for (int64_t t = 0; t < nb; ++t) {
    int64_t rem = t, oa = 0, ob = 0, sa = 1, sb = 1;
    for (size_t i = batch.size(); i-- > 0;) {
      const int64_t idx = rem % batch[i];
      rem /= batch[i];
      oa += (ab[i] == 1 ? 0 : idx) * sa, sa *= ab[i];
      ob += (bb[i] == 1 ? 0 : idx) * sb, sb *= bb[i];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, sc = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = a[oa * m * k + i * k + p], y = b[ob * k * n + p * n + j];
          s += x * y, sc += std::fabs(x * y);
        }
        out[t * m * n + i * n + j] = s;
        scale[t * m * n + i * n + j] = sc;
      }
  }
}

void CheckMatMul(const Shape& as, const Shape& bs, const Shape& want_shape, const CpuContext& cpu = CpuContext{}) {
  SCOPED_TRACE("MatMul " + ShapeToString(as) + " x " + ShapeToString(bs));
  const Vec a = RandomVec(Numel(as), 1), b = RandomVec(Numel(bs), 2);
  OneNode t;
  t.Input(MakeTensor(DType::kF32, as, a));
  t.Input(MakeTensor(DType::kF32, bs, b));
  auto out = t.AddRun("MatMul", {}, -1, cpu);
  ASSERT_EQ(out.size(), 1u);
  ExpectShape(out[0], want_shape);
  Vec ref, scale;
  RefMatMul(a, as, b, bs, ref, scale);
  const Vec got = Values(out[0]);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - ref[i]), 1e-5 * scale[i] + 1e-30) << "element " << i;
}

TEST(Kernels, MatMul2D) {
  CheckMatMul({5, 7}, {7, 3}, {5, 3});
  CheckMatMul({64, 96}, {96, 33}, {64, 33});
  CheckMatMul({1, 1}, {1, 1}, {1, 1});
}

TEST(Kernels, MatMulBatchedBroadcast) {
  CheckMatMul({2, 3, 4, 5}, {5, 6}, {2, 3, 4, 6});        // shared weights: one big GEMM
  CheckMatMul({2, 1, 4, 5}, {3, 5, 6}, {2, 3, 4, 6});     // both sides broadcast
  CheckMatMul({4, 5}, {3, 5, 6}, {3, 4, 6});              // A shared across B's batches
  CheckMatMul({2, 3, 4, 5}, {2, 3, 5, 2}, {2, 3, 4, 2});  // matching batches
}

TEST(Kernels, MatMulOneDimensional) {
  CheckMatMul({5}, {5, 3}, {3});
  CheckMatMul({4, 5}, {5}, {4});
  CheckMatMul({5}, {5}, {});
  CheckMatMul({2, 4, 5}, {5}, {2, 4});
  CheckMatMul({5}, {2, 5, 3}, {2, 3});
}

TEST(Kernels, MatMulZeroInnerDimGivesZeros) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 0}, {}));
  t.Input(MakeTensor(DType::kF32, {0, 3}, {}));
  auto out = t.AddRun("MatMul");
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(Values(out[0]), Vec(6, 0.0), 0, 0, "zeros");
}

TEST(Kernels, MatMulInnerMismatchNamesBothShapes) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 1)));
  t.Input(MakeTensor(DType::kF32, {4, 5}, Vec(20, 1)));
  const std::string e = ErrorOf(t.Add("MatMul"));
  EXPECT_TRUE(Contains(e, "[2,3]") && Contains(e, "[4,5]") && Contains(e, "MatMul")) << e;
  EXPECT_TRUE(Contains(e, "inner")) << e;
}

TEST(Kernels, MatMulBatchMismatchAndNonF32AreErrors) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 3, 4}, Vec(24, 1)));
  t.Input(MakeTensor(DType::kF32, {3, 4, 5}, Vec(60, 1)));
  const std::string e = ErrorOf(t.Add("MatMul"));
  EXPECT_TRUE(Contains(e, "batch")) << e;

  OneNode h;
  h.Input(MakeTensor(DType::kF16, {2, 3}, Vec(6, 1)));
  h.Input(MakeTensor(DType::kF16, {3, 2}, Vec(6, 1)));
  auto n = h.Add("MatMul");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  auto r = h.Run(*n);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(r.status().message(), "f16") && Contains(r.status().message(), "MatMul")) << r.status().message();
}

void CheckGemm(bool ta, bool tb, float alpha, float beta, const Shape* c_shape) {
  SCOPED_TRACE(StrCat("Gemm transA=", ta, " transB=", tb, " alpha=", alpha, " beta=", beta));
  const int64_t m = 6, k = 9, n = 5;
  const Shape as = ta ? Shape{k, m} : Shape{m, k}, bs = tb ? Shape{n, k} : Shape{k, n};
  const Vec a = RandomVec(m * k, 3), b = RandomVec(k * n, 4);
  OneNode t;
  t.Input(MakeTensor(DType::kF32, as, a));
  t.Input(MakeTensor(DType::kF32, bs, b));
  Vec c;
  if (c_shape) {
    c = RandomVec(Numel(*c_shape), 5);
    t.Input(MakeTensor(DType::kF32, *c_shape, c));
  }
  auto out = t.AddRun("Gemm", {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}, {"alpha", alpha}, {"beta", beta}});
  ASSERT_EQ(out.size(), 1u);
  ExpectShape(out[0], {m, n});
  const Vec got = Values(out[0]);
  std::vector<int64_t> cst = {0, 0};
  if (c_shape) {
    const Shape& cs = *c_shape;
    if (cs.size() == 2) cst = {cs[0] == 1 ? 0 : cs[1], cs[1] == 1 ? 0 : 1};
    if (cs.size() == 1) cst = {0, cs[0] == 1 ? 0 : 1};
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[p * m + i] : a[i * k + p], y = tb ? b[j * k + p] : b[p * n + j];
        s += x * y, sc += std::fabs(x * y);
      }
      double want = alpha * s;
      if (c_shape) want += beta * c[i * cst[0] + j * cst[1]];
      ASSERT_NEAR(got[i * n + j], want, 1e-5 * (std::fabs(alpha) * sc + std::fabs(want)) + 1e-6) << i << "," << j;
    }
}

TEST(Kernels, GemmTransposesAlphaBetaAndBroadcastC) {
  const Shape c_full = {6, 5}, c_row = {5}, c_col = {6, 1}, c_scalar = {};
  CheckGemm(false, false, 1.f, 1.f, nullptr);
  CheckGemm(true, false, 0.5f, 2.f, &c_full);
  CheckGemm(false, true, 1.5f, -1.f, &c_row);
  CheckGemm(true, true, -2.f, 0.25f, &c_col);
  CheckGemm(false, false, 1.f, 3.f, &c_scalar);
}

TEST(Kernels, GemmBadCIsAnError) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 1)));
  t.Input(MakeTensor(DType::kF32, {3, 4}, Vec(12, 1)));
  t.Input(MakeTensor(DType::kF32, {3}, Vec(3, 1)));
  const std::string e = ErrorOf(t.Add("Gemm"));
  EXPECT_TRUE(Contains(e, "[3]") && Contains(e, "[2,4]")) << e;
}

// ------------------------------------------------------------------ Softmax

Vec RefSoftmax(const Vec& x, const Shape& s, int64_t axis, bool log) {
  if (axis < 0) axis += static_cast<int64_t>(s.size());
  const int64_t n = s[axis], inner = Numel(Shape(s.begin() + axis + 1, s.end()));
  const int64_t outer = static_cast<int64_t>(x.size()) / (n * inner);
  Vec y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return o * n * inner + k * inner + i; };
      double m = -INFINITY, sum = 0;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, x[at(k)]);
      for (int64_t k = 0; k < n; ++k) sum += std::exp(x[at(k)] - m);
      for (int64_t k = 0; k < n; ++k) y[at(k)] = log ? x[at(k)] - m - std::log(sum) : std::exp(x[at(k)] - m) / sum;
    }
  return y;
}

TEST(Kernels, SoftmaxMatchesReferenceAndRowsSumToOne) {
  Threaded th;
  for (const CpuContext& cpu : {CpuContext{}, th.cpu}) {
    for (int64_t n : {1, 7, 16, 33, 100}) {
      const Shape s = {3, n};
      const Vec x = RandomVec(3 * n, 7, -30, 30);
      OneNode t;
      t.Input(MakeTensor(DType::kF32, s, x));
      auto out = t.AddRun("Softmax", {}, -1, cpu);
      ASSERT_EQ(out.size(), 1u);
      const Vec y = Values(out[0]);
      ExpectNear(y, RefSoftmax(x, s, -1, false), 1e-5, 1e-7, StrCat("softmax n=", n));
      for (int64_t r = 0; r < 3; ++r) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += y[r * n + j];
        EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
      }
    }
  }
}

// Masked keys: vectors whose lanes all lie more than 104 below the row's max skip exp and store
// +0 (softmax_row.h). Lanes 51..96 below the max must still come out positive (exp is tiny but
// not 0 there), lanes below -104 exactly 0, and every lane as the float64 reference says.
TEST(Kernels, SoftmaxMaskedLanesUnderflowExactly) {
  constexpr int64_t n = 80;  // five vectors of 16 lanes (four of 8 on AVX2 targets, plus a tail)
  Vec x(n);
  for (int64_t j = 0; j < n; ++j) {
    const double u = static_cast<double>(j % 16) / 16;
    if (j < 16) x[j] = 5 - 5 * u;                                   // the max (5) and its vector
    else if (j < 32) x[j] = 5 - 51 - 45 * u;                        // 51..96 below the max
    else if (j < 48) x[j] = -1e9;                                   // masked
    else if (j < 64) x[j] = j % 2 ? -1e9 : 5 - 20 * u;              // half masked
    else x[j] = 5 - 104.5 - 15 * u;                                 // beyond -104: underflows
  }
  const double m = *std::max_element(x.begin(), x.end());
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {1, n}, x));
  auto out = t.AddRun("Softmax");
  ASSERT_EQ(out.size(), 1u);
  const Vec y = Values(out[0]);
  const Vec ref = RefSoftmax(x, {1, n}, -1, false);
  for (int64_t j = 0; j < n; ++j) {
    const double d = x[j] - m;
    if (d < -104) {
      EXPECT_EQ(y[j], 0.0) << "lane " << j << ", " << d << " below the max";
    } else if (d > -100) {
      EXPECT_GT(y[j], 0.0) << "lane " << j << ", " << d << " below the max";
      // Relative to the reference while normal; a few subnormal steps below FLT_MIN.
      EXPECT_NEAR(y[j], ref[j], std::max(1e-5 * ref[j], 8 * 1.4e-45)) << "lane " << j;
    }
  }
}

// What the softmax rows rely on in simd::exp_softmax (their exp, of x - max <= 0): +0 exactly
// at and below -104 (whole vectors there store +0 without calling it, and mixed vectors must
// agree), NaN stays NaN, within 1 ulp of the correctly rounded result elsewhere (every 97th f32
// of (-104, 0]), and each lane's result independent of the other lanes.
TEST(Kernels, SoftmaxExpUnderflowsToPlusZeroAndStaysAccurate) {
  using simd::kLanes;
  auto exp_softmax = [](float x) {
    alignas(64) float lanes[kLanes];
    simd::exp_softmax(simd::VF(x)).Store(lanes);
    return lanes[kLanes - 1];
  };
  int64_t zeros = 0;
  for (uint32_t bits = 0xC2D00000u; bits < 0xFF800000u; bits += 97) {  // -104 down to -FLT_MAX
    float x;
    std::memcpy(&x, &bits, 4);
    const float y = exp_softmax(x);
    uint32_t yb;
    std::memcpy(&yb, &y, 4);
    ASSERT_EQ(yb, 0u) << "exp_softmax(" << x << ") = " << y;
    ++zeros;
  }
  EXPECT_GT(zeros, 10000000);
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_softmax(ninf), 0.f);
  EXPECT_FALSE(std::signbit(exp_softmax(ninf)));
  EXPECT_TRUE(std::isnan(exp_softmax(std::numeric_limits<float>::quiet_NaN())));
  int64_t worst = 0;
  float worst_at = 0;
  auto check = [&](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, 4);
    const float y = exp_softmax(x), ref = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t d = std::abs(testing::FloatOrdinal(y) - testing::FloatOrdinal(ref));
    if (d > worst) worst = d, worst_at = x;
  };
  for (uint32_t bits = 0xC2D00000u; bits > 0x80000000u; bits -= 97) check(bits);  // (-104, 0)
  check(0);
  EXPECT_LE(worst, 1) << "worst at " << worst_at;
  // A lane's result depends on its own value only: plans that group elements into vectors
  // differently must get the same bits, whatever lies in the neighbouring lanes (a -1e9 mask
  // lane, NaN, a lane beyond the fast range).
  for (float x : {-103.f, -90.f, -87.31f, -87.3f, -20.5f, -1.f, 0.f}) {
    for (float neighbour : {-1e9f, std::numeric_limits<float>::quiet_NaN(), 88.5f, 1.f}) {
      alignas(64) float in[kLanes], out[kLanes];
      std::fill(in, in + kLanes, neighbour);
      in[kLanes - 1] = x;
      simd::exp_softmax(simd::VF::Load(in)).Store(out);
      const float alone = exp_softmax(x), neighbour_alone = exp_softmax(neighbour);
      EXPECT_EQ(std::memcmp(&out[kLanes - 1], &alone, 4), 0) << "exp_softmax(" << x << ") next to " << neighbour;
      EXPECT_EQ(std::memcmp(&out[0], &neighbour_alone, 4), 0) << "exp_softmax(" << neighbour << ") next to " << x;
    }
  }
  std::printf("  exp_softmax: worst %lld ulp from the correctly rounded result (at %g)\n", static_cast<long long>(worst), worst_at);
}

TEST(Kernels, SoftmaxIsStableForHugeInputs) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {1, 3}, {1000, 1001, 1002}));
  auto out = t.AddRun("Softmax");
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(Values(out[0]), RefSoftmax({1000, 1001, 1002}, {1, 3}, -1, false), 1e-5, 0, "stable");
}

TEST(Kernels, SoftmaxAndLogSoftmaxOverAMiddleAxis) {
  const Shape s = {2, 5, 3};
  const Vec x = RandomVec(30, 8, -5, 5);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const bool log = std::string(op) == "LogSoftmax";
    OneNode t;
    t.Input(MakeTensor(DType::kF32, s, x));
    auto out = t.AddRun(op, {{"axis", int64_t{1}}});
    ASSERT_EQ(out.size(), 1u);
    ExpectNear(Values(out[0]), RefSoftmax(x, s, 1, log), 1e-5, 1e-6, op);
  }
  OneNode t;  // default axis -1 on a 3-D LogSoftmax
  t.Input(MakeTensor(DType::kF32, s, x));
  auto out = t.AddRun("LogSoftmax");
  ExpectNear(Values(out[0]), RefSoftmax(x, s, -1, true), 1e-5, 1e-6, "logsoftmax axis -1");
}

// LogSoftmax of rows far from zero (ONNX's test_logsoftmax_large_number): the result is small,
// so it must not carry the rounding of max + log(sum) at the magnitude of the inputs (5e-4 at
// 1e4). Rows and columns (a middle axis), vector bodies and tails, against float64.
TEST(Kernels, LogSoftmaxKeepsPrecisionAtLargeOffsets) {
  for (double offset : {1e4, -1e4, 3.3e5, 1e7}) {
    for (int64_t n : {4, 37}) {
      Vec x = RandomVec(3 * n * 2, 21, -4, 4);
      for (double& v : x) v = static_cast<float>(v + offset);  // the f32 inputs, exactly
      for (int64_t axis : {-1, 1}) {
        const Shape s = axis == -1 ? Shape{6, n} : Shape{3, n, 2};
        OneNode t;
        t.Input(MakeTensor(DType::kF32, s, x));
        auto out = t.AddRun("LogSoftmax", {{"axis", axis}});
        ASSERT_EQ(out.size(), 1u);
        // Results lie in [-12, 0]: a few f32 ulps of that, nothing of the offset's ulp.
        ExpectNear(Values(out[0]), RefSoftmax(x, s, axis, true), 1e-6, 2e-6,
                   StrCat("logsoftmax offset ", offset, " n ", n, " axis ", axis));
      }
    }
  }
}

TEST(Kernels, SoftmaxOverLongColumnsInBlocks) {
  // Non-innermost axis with inner = 130 (column blocks of 64, 64, 2) and 150 rows per column.
  Threaded th;
  const Shape s = {2, 150, 130};
  const Vec x = RandomVec(Numel(s), 10, -20, 20);
  for (const CpuContext& cpu : {CpuContext{}, th.cpu})
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      OneNode t;
      t.Input(MakeTensor(DType::kF32, s, x));
      auto out = t.AddRun(op, {{"axis", int64_t{-2}}}, -1, cpu);
      ASSERT_EQ(out.size(), 1u);
      ExpectNear(Values(out[0]), RefSoftmax(x, s, 1, std::string(op) == "LogSoftmax"), 1e-5, 1e-6, op);
    }
}

TEST(Kernels, SoftmaxF16AndErrors) {
  const Vec x = RandomVec(12, 9);
  OneNode t;
  t.Input(MakeTensor(DType::kF16, {3, 4}, x));
  auto out = t.AddRun("Softmax");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::kF16);
  // Inputs were rounded to f16 by MakeTensor; compare against the rounded values.
  Tensor in16 = MakeTensor(DType::kF16, {3, 4}, x);
  ExpectNear(Values(out[0]), RefSoftmax(Values(in16), {3, 4}, -1, false), 2e-3, 1e-4, "f16 softmax");

  OneNode bad;
  bad.Input(MakeTensor(DType::kI32, {2, 2}, Vec(4, 1)));
  EXPECT_TRUE(Contains(ErrorOf(bad.Add("Softmax")), "float")) << ErrorOf(bad.Add("Softmax"));
  OneNode axis;
  axis.Input(MakeTensor(DType::kF32, {2, 2}, Vec(4, 1)));
  EXPECT_TRUE(Contains(ErrorOf(axis.Add("Softmax", {{"axis", int64_t{2}}})), "out of range"));
}

// ------------------------------------------------------------------ LayerNorm / RMSNorm

// y, mean, inv_std of a row normalization over the trailing `d` elements.
void RefNorm(const Vec& x, int64_t d, const Vec& scale, const Vec& bias, double eps, bool rms, Vec& y, Vec& mean,
             Vec& inv) {
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  y.assign(x.size(), 0), mean.assign(rows, 0), inv.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mu += x[r * d + j];
    mu /= d;
    for (int64_t j = 0; j < d; ++j) {
      const double c = rms ? x[r * d + j] : x[r * d + j] - mu;
      var += c * c;
    }
    var /= d;
    const double is = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j)
      y[r * d + j] = (rms ? x[r * d + j] : x[r * d + j] - mu) * is * scale[j] + (bias.empty() ? 0 : bias[j]);
    mean[r] = mu, inv[r] = is;
  }
}

TEST(Kernels, LayerNormalizationMatchesReference) {
  Threaded th;
  for (const CpuContext& cpu : {CpuContext{}, th.cpu}) {
    const Shape s = {4, 3, 16};
    const Vec x = RandomVec(4 * 3 * 16, 11, -3, 5), scale = RandomVec(16, 12), bias = RandomVec(16, 13);
    OneNode t;
    t.Input(MakeTensor(DType::kF32, s, x));
    t.Input(MakeTensor(DType::kF32, {16}, scale));
    t.Input(MakeTensor(DType::kF32, {16}, bias));
    auto out = t.AddRun("LayerNormalization", {}, 3, cpu);
    ASSERT_EQ(out.size(), 3u);
    ExpectShape(out[1], {4, 3, 1});
    Vec y, mean, inv;
    RefNorm(x, 16, scale, bias, 1e-5, false, y, mean, inv);
    ExpectNear(Values(out[0]), y, 1e-5, 1e-5, "Y");
    ExpectNear(Values(out[1]), mean, 1e-6, 1e-6, "Mean");
    ExpectNear(Values(out[2]), inv, 1e-5, 0, "InvStdDev");
  }
}

TEST(Kernels, LayerNormalizationAxisBroadcastScaleNoBias) {
  // axis 1 normalizes [3,8] per batch; scale [8] broadcasts over the 3.
  const Shape s = {2, 3, 8};
  const Vec x = RandomVec(48, 14), scale8 = RandomVec(8, 15);
  OneNode t;
  t.Input(MakeTensor(DType::kF32, s, x));
  t.Input(MakeTensor(DType::kF32, {8}, scale8));
  auto out = t.AddRun("LayerNormalization", {{"axis", int64_t{1}}, {"epsilon", 1e-3f}}, 1);
  ASSERT_EQ(out.size(), 1u);
  Vec scale24;
  for (int i = 0; i < 3; ++i) scale24.insert(scale24.end(), scale8.begin(), scale8.end());
  Vec y, mean, inv;
  RefNorm(x, 24, scale24, {}, 1e-3, false, y, mean, inv);
  ExpectNear(Values(out[0]), y, 1e-5, 1e-5, "axis=1");
}

TEST(Kernels, LayerNormalizationKeepsVarianceOfLargeMean) {
  // Two-pass statistics: a row around 1e4 with unit spread keeps its variance.
  Vec x = RandomVec(256, 16);
  for (double& v : x) v = static_cast<float>(1e4 + v);
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 128}, x));
  t.Input(MakeTensor(DType::kF32, {128}, Vec(128, 1)));
  auto out = t.AddRun("LayerNormalization", {}, 1);
  Vec y, mean, inv;
  RefNorm(x, 128, Vec(128, 1), {}, 1e-5, false, y, mean, inv);
  ExpectNear(Values(out[0]), y, 1e-3, 1e-3, "large mean");
}

TEST(Kernels, RmsNormMatchesReference) {
  Threaded th;
  for (const CpuContext& cpu : {CpuContext{}, th.cpu}) {
    const Vec x = RandomVec(5 * 32, 17), scale = RandomVec(32, 18);
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {5, 32}, x));
    t.Input(MakeTensor(DType::kF32, {32}, scale));
    auto out = t.AddRun("RMSNorm", {}, -1, cpu);
    ASSERT_EQ(out.size(), 1u);
    Vec y, mean, inv;
    RefNorm(x, 32, scale, {}, 1e-6, true, y, mean, inv);
    ExpectNear(Values(out[0]), y, 1e-5, 1e-6, "RMSNorm");
  }
  // No scale, axis 1 of a 3-D input, bf16 storage.
  const Vec x = RandomVec(2 * 3 * 4, 19);
  OneNode t;
  t.Input(MakeTensor(DType::kBF16, {2, 3, 4}, x));
  auto out = t.AddRun("RMSNorm", {{"axis", int64_t{1}}, {"epsilon", 1e-2f}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::kBF16);
  Vec y, mean, inv;
  RefNorm(Values(MakeTensor(DType::kBF16, {2, 3, 4}, x)), 12, Vec(12, 1), {}, 1e-2, true, y, mean, inv);
  ExpectNear(Values(out[0]), y, 1e-2, 1e-2, "bf16 RMSNorm");
}

// The row sums that norms and softmax share have a fast form (one fused multiply-add per vector;
// vector adds for the lane tree) that must give the definitional form's bits: RowSumD over
// v * v and the 32 partial sums written out, and the lane tree added pairwise in double,
// lane l + lane l + kLanes/2 first.
TEST(Kernels, RowSumsKeepTheDefinitionalBits) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> e(-140, 120);
  auto value = [&] {  // spread over the whole exponent range, subnormals included
    return std::ldexp(u(rng), e(rng));
  };
  for (int64_t n : {0, 1, 7, 31, 32, 33, 64, 95, 512, 4096 + 13}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = value();
      if (trial == 1 && n > 0) x[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::infinity();
      if (trial == 2 && n > 0) x[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::quiet_NaN();
      if (trial == 3)
        for (float& v : x) v = std::numeric_limits<float>::max() * u(rng);
      const double fast = kernels::RowSumSquaresD(x.data(), n);
      const double slow = kernels::RowSumD(x.data(), n, [](auto v) { return v * v; });
      EXPECT_TRUE(std::memcmp(&fast, &slow, sizeof fast) == 0 || (std::isnan(fast) && std::isnan(slow)))
          << "n=" << n << " trial " << trial << ": " << fast << " vs " << slow;
      // The definition, lane by lane: element j to partial j % 32, then the fixed tree. Both
      // vector layouts (four 8-lane or eight 4-lane accumulators) must give its bits.
      double part[32] = {};
      for (int64_t j = 0; j < n; ++j) part[j % 32] += static_cast<double>(x[j]) * static_cast<double>(x[j]);
      double p8[8];
      for (int l = 0; l < 8; ++l) p8[l] = (part[l] + part[l + 8]) + (part[l + 16] + part[l + 24]);
      const double def = ((p8[0] + p8[1]) + (p8[2] + p8[3])) + ((p8[4] + p8[5]) + (p8[6] + p8[7]));
      EXPECT_TRUE(std::memcmp(&fast, &def, sizeof fast) == 0 || (std::isnan(fast) && std::isnan(def)))
          << "n=" << n << " trial " << trial << ": " << fast << " vs definition " << def;
    }
  }
  for (int trial = 0; trial < 2000; ++trial) {
    alignas(64) float lanes[simd::kLanes];
    for (float& v : lanes) v = value();
    if (trial % 7 == 3) lanes[trial % simd::kLanes] = std::numeric_limits<float>::max();
    double t[simd::kLanes];
    for (int l = 0; l < simd::kLanes; ++l) t[l] = lanes[l];
    for (int w = simd::kLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) t[l] += t[l + w];
    const double got = simd::SumOfLanesF64(simd::VF::Load(lanes));
    ASSERT_EQ(std::memcmp(&got, &t[0], sizeof got), 0) << "trial " << trial << ": " << got << " vs " << t[0];
  }
}

TEST(Kernels, NormErrors) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 8}, Vec(16, 1)));
  t.Input(MakeTensor(DType::kF32, {7}, Vec(7, 1)));
  const std::string e = ErrorOf(t.Add("LayerNormalization"));
  EXPECT_TRUE(Contains(e, "[7]") && Contains(e, "[8]")) << e;
  OneNode i;
  i.Input(MakeTensor(DType::kI64, {2, 8}, Vec(16, 1)));
  EXPECT_TRUE(Contains(ErrorOf(i.Add("RMSNorm")), "float"));
}

// ------------------------------------------------------------------ reductions

// Reference reduction over `axes` (normalized), in double.
Vec RefReduce(const Vec& x, const Shape& s, const std::vector<int64_t>& axes, const std::string& op) {
  Shape out_shape = s;
  for (int64_t a : axes) out_shape[a] = 1;
  const int64_t n_out = Numel(out_shape);
  Vec acc(static_cast<size_t>(n_out), op == "ReduceMax" ? -INFINITY : 0.0);
  const int64_t count = Numel(s) / std::max<int64_t>(n_out, 1);
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    int64_t rem = i, o = 0, mul = 1;
    for (size_t d = s.size(); d-- > 0;) {
      const int64_t idx = rem % s[d];
      rem /= s[d];
      o += (out_shape[d] == 1 ? 0 : idx) * mul;
      mul *= out_shape[d];
    }
    acc[o] = op == "ReduceMax" ? std::max(acc[o], x[i]) : acc[o] + x[i];
  }
  if (op == "ReduceMean")
    for (double& v : acc) v /= count;
  return acc;
}

TEST(Kernels, ReductionsMatchReferenceWithKeepdimsAndNegativeAxes) {
  const Shape s = {3, 4, 5, 6};
  const Vec x = RandomVec(Numel(s), 21);
  Threaded th;
  const std::vector<std::vector<int64_t>> axes_cases = {{-1}, {0}, {1, 2}, {0, 3}, {-3, -1}, {1}, {0, 1, 2, 3}};
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax"}) {
    for (const auto& axes : axes_cases) {
      for (int64_t keep : {0, 1}) {
        for (bool as_input : {false, true}) {
          SCOPED_TRACE(StrCat(op, " axes=", ShapeToString(axes), " keepdims=", keep, " as_input=", as_input));
          OneNode t;
          t.Input(MakeTensor(DType::kF32, s, x));
          AttributeMap attrs = {{"keepdims", keep}};
          if (as_input) t.ConstI64(axes);
          else attrs["axes"] = axes;
          auto out = t.AddRun(op, attrs, -1, as_input ? th.cpu : CpuContext{});
          ASSERT_EQ(out.size(), 1u);
          std::vector<int64_t> norm;
          for (int64_t a : axes) norm.push_back(a < 0 ? a + 4 : a);
          Shape want;
          for (int64_t d = 0; d < 4; ++d) {
            const bool red = std::find(norm.begin(), norm.end(), d) != norm.end();
            if (!red) want.push_back(s[d]);
            else if (keep) want.push_back(1);
          }
          ExpectShape(out[0], want);
          ExpectNear(Values(out[0]), RefReduce(x, s, norm, op), 1e-6, 1e-6, op);
        }
      }
    }
  }
}

TEST(Kernels, ReduceDefaultsEmptyAxesAndInts) {
  const Vec x = Iota(6, -2);  // -2 .. 3
  {  // no axes: reduce everything, keepdims 1
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 3}, x));
    auto out = t.AddRun("ReduceSum");
    ExpectShape(out[0], {1, 1});
    EXPECT_EQ(out[0].GetAsDouble(0), 3.0);
  }
  {  // noop_with_empty_axes: identity
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 3}, x));
    auto out = t.AddRun("ReduceSum", {{"noop_with_empty_axes", int64_t{1}}});
    ExpectShape(out[0], {2, 3});
    ExpectNear(Values(out[0]), x, 0, 0, "noop");
  }
  {  // integer ReduceMax and ReduceMean (mean truncates like numpy's cast)
    OneNode t;
    t.Input(MakeTensor(DType::kI64, {2, 3}, x));
    t.ConstI64({1});
    auto out = t.AddRun("ReduceMax", {{"keepdims", int64_t{0}}});
    ExpectShape(out[0], {2});
    ExpectNear(Values(out[0]), {0, 3}, 0, 0, "i64 max");
  }
  {  // ReduceMax propagates NaN
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 2}, {1, NAN, 3, 4}));
    auto out = t.AddRun("ReduceMax", {{"axes", std::vector<int64_t>{1}}});
    EXPECT_TRUE(std::isnan(out[0].GetAsDouble(0)));
    EXPECT_EQ(out[0].GetAsDouble(1), 4.0);
  }
  {  // f16 ReduceMean over a size-1 dim and a real one
    OneNode t;
    t.Input(MakeTensor(DType::kF16, {2, 1, 3}, x));
    auto out = t.AddRun("ReduceMean", {{"axes", std::vector<int64_t>{1, 2}}});
    ExpectShape(out[0], {2, 1, 1});
    ExpectNear(Values(out[0]), {-1, 2}, 0, 0, "f16 mean");
  }
}

TEST(Kernels, ReduceErrors) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 1)));
  EXPECT_TRUE(Contains(ErrorOf(t.Add("ReduceSum", {{"axes", std::vector<int64_t>{2}}})), "out of range"));
  EXPECT_TRUE(Contains(ErrorOf(t.Add("ReduceMean", {{"axes", std::vector<int64_t>{1, -1}}})), "repeat"));
  OneNode d;  // axes computed at run time
  Value* x = d.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 1)));
  Value* axes = d.Input(MakeTensor(DType::kI64, {1}, {1}));
  const std::string e = ErrorOf(d.Add("ReduceSum", {}, -1, {x, axes}));
  EXPECT_TRUE(Contains(e, "needs a constant axes input")) << e;
}

// ------------------------------------------------------------------ data movement

TEST(Kernels, TransposeMatchesIndexMapping) {
  Threaded th;
  const Shape s = {2, 3, 4, 5};
  const Vec x = Iota(Numel(s));
  for (const CpuContext& cpu : {CpuContext{}, th.cpu}) {
    for (const std::vector<int64_t>& perm : std::vector<std::vector<int64_t>>{{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}, {0, 1, 2, 3}}) {
      OneNode t;
      t.Input(MakeTensor(DType::kF32, s, x));
      auto out = t.AddRun("Transpose", {{"perm", perm}}, -1, cpu);
      Shape os(4);
      for (int i = 0; i < 4; ++i) os[i] = s[perm[i]];
      ExpectShape(out[0], os);
      const std::vector<int64_t> st = {60, 20, 5, 1};
      Vec want;
      for (int64_t a = 0; a < os[0]; ++a)
        for (int64_t b = 0; b < os[1]; ++b)
          for (int64_t c = 0; c < os[2]; ++c)
            for (int64_t d = 0; d < os[3]; ++d)
              want.push_back(static_cast<double>(a * st[perm[0]] + b * st[perm[1]] + c * st[perm[2]] + d * st[perm[3]]));
      ExpectNear(Values(out[0]), want, 0, 0, "perm " + ShapeToString(perm));
    }
  }
  // Tiled 2-D transposes with ragged tiles, for 1-, 2-, 4- and 8-byte elements.
  for (DType dt : {DType::kBool, DType::kF16, DType::kI32, DType::kI64}) {
    const Shape s3 = {3, 45, 70};
    Vec v = Iota(Numel(s3));
    if (dt == DType::kBool) for (double& e : v) e = static_cast<int64_t>(e) % 3 == 0;
    if (dt == DType::kF16) for (double& e : v) e = std::fmod(e, 2048);
    for (const CpuContext& cpu : {CpuContext{}, th.cpu}) {
      OneNode t;
      t.Input(MakeTensor(dt, s3, v));
      auto out = t.AddRun("Transpose", {{"perm", std::vector<int64_t>{0, 2, 1}}}, -1, cpu);
      ExpectShape(out[0], {3, 70, 45});
      Vec want;
      for (int64_t a = 0; a < 3; ++a)
        for (int64_t c = 0; c < 70; ++c)
          for (int64_t b = 0; b < 45; ++b) want.push_back(v[a * 45 * 70 + b * 70 + c]);
      ExpectNear(Values(out[0]), want, 0, 0, StrCat("tiled ", DTypeName(dt)));
    }
  }
  OneNode t;  // default perm reverses; i64 data moves as bytes
  t.Input(MakeTensor(DType::kI64, {2, 3}, Iota(6)));
  auto out = t.AddRun("Transpose");
  ExpectShape(out[0], {3, 2});
  ExpectNear(Values(out[0]), {0, 3, 1, 4, 2, 5}, 0, 0, "default perm");
  OneNode bad;
  bad.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 0)));
  EXPECT_TRUE(Contains(ErrorOf(bad.Add("Transpose", {{"perm", std::vector<int64_t>{0, 0}}})), "permutation"));
}

TEST(Kernels, ConcatAndSplit) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {2, 1}, {0, 10}));
  t.Input(MakeTensor(DType::kF32, {2, 2}, {1, 2, 11, 12}));
  t.Input(MakeTensor(DType::kF32, {2, 0}, {}));
  auto out = t.AddRun("Concat", {{"axis", int64_t{-1}}});
  ExpectShape(out[0], {2, 3});
  ExpectNear(Values(out[0]), {0, 1, 2, 10, 11, 12}, 0, 0, "concat");

  OneNode c0;
  c0.Input(MakeTensor(DType::kI32, {1, 2}, {1, 2}));
  c0.Input(MakeTensor(DType::kI32, {2, 2}, {3, 4, 5, 6}));
  auto o0 = c0.AddRun("Concat", {{"axis", int64_t{0}}});
  ExpectNear(Values(o0[0]), {1, 2, 3, 4, 5, 6}, 0, 0, "concat axis 0");

  OneNode s;  // split sizes from the input
  s.Input(MakeTensor(DType::kF32, {2, 5}, Iota(10)));
  s.ConstI64({2, 3});
  auto parts = s.AddRun("Split", {{"axis", int64_t{1}}});
  ASSERT_EQ(parts.size(), 2u);
  ExpectNear(Values(parts[0]), {0, 1, 5, 6}, 0, 0, "split 0");
  ExpectNear(Values(parts[1]), {2, 3, 4, 7, 8, 9}, 0, 0, "split 1");

  OneNode e;  // equal parts (num_outputs), last one smaller
  e.Input(MakeTensor(DType::kF32, {5}, Iota(5)));
  auto eq = e.AddRun("Split", {{"num_outputs", int64_t{3}}});
  ASSERT_EQ(eq.size(), 3u);
  ExpectNear(Values(eq[0]), {0, 1}, 0, 0, "eq0");
  ExpectNear(Values(eq[1]), {2, 3}, 0, 0, "eq1");
  ExpectNear(Values(eq[2]), {4}, 0, 0, "eq2");

  OneNode a;  // opset-11 'split' attribute
  a.Input(MakeTensor(DType::kF32, {4}, Iota(4)));
  auto ap = a.AddRun("Split", {{"split", std::vector<int64_t>{1, 3}}});
  ASSERT_EQ(ap.size(), 2u);
  ExpectNear(Values(ap[1]), {1, 2, 3}, 0, 0, "split attr");

  OneNode bad;
  bad.Input(MakeTensor(DType::kF32, {2, 5}, Iota(10)));
  bad.ConstI64({2, 2});
  EXPECT_TRUE(Contains(ErrorOf(bad.Add("Split", {{"axis", int64_t{1}}})), "sums to 4"));
  OneNode mis;
  mis.Input(MakeTensor(DType::kF32, {2, 2}, Iota(4)));
  mis.Input(MakeTensor(DType::kF32, {3, 3}, Iota(9)));
  EXPECT_TRUE(Contains(ErrorOf(mis.Add("Concat", {{"axis", int64_t{0}}})), "[3,3]"));
  EXPECT_TRUE(Contains(ErrorOf(mis.Add("Concat")), "axis"));
}

// Slice of a 4x5 iota (x[r][c] = 5r + c).
Vec SliceRun(const std::vector<int64_t>& starts, const std::vector<int64_t>& ends, const std::vector<int64_t>& axes,
             const std::vector<int64_t>& steps, Shape* shape, const CpuContext& cpu = CpuContext{}) {
  OneNode t;
  Value* x = t.Input(MakeTensor(DType::kF32, {4, 5}, Iota(20)));
  std::vector<Value*> in = {x, t.ConstI64(starts), t.ConstI64(ends)};
  in.push_back(axes.empty() && steps.empty() ? nullptr : t.ConstI64(axes));
  if (!steps.empty()) in.push_back(t.ConstI64(steps));
  if (in.back() == nullptr) in.pop_back();
  auto n = t.Add("Slice", {}, -1, in);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  if (!n.ok()) return {};
  auto r = t.Run(*n, cpu);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  *shape = (*r)[0].shape();
  return Values((*r)[0]);
}

TEST(Kernels, SliceClampsAndStepsBothWays) {
  Shape s;
  ExpectNear(SliceRun({1, 1}, {3, 4}, {}, {}, &s), {6, 7, 8, 11, 12, 13}, 0, 0, "basic");
  EXPECT_EQ(s, (Shape{2, 3}));
  ExpectNear(SliceRun({1}, {INT64_MAX}, {1}, {}, &s), {1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19}, 0, 0,
             "INT64_MAX end");
  ExpectNear(SliceRun({-2}, {-1}, {0}, {}, &s), {10, 11, 12, 13, 14}, 0, 0, "negative start/end");
  ExpectNear(SliceRun({-1}, {INT64_MIN}, {1}, {-2}, &s), {4, 2, 0, 9, 7, 5, 14, 12, 10, 19, 17, 15}, 0, 0,
             "negative step to the start");
  EXPECT_EQ(s, (Shape{4, 3}));
  ExpectNear(SliceRun({10, 3}, {-10, 0}, {0, -1}, {-1, -1}, &s), {18, 17, 16, 13, 12, 11, 8, 7, 6, 3, 2, 1}, 0, 0,
             "clamped start, two axes reversed");
  ExpectNear(SliceRun({3}, {1}, {0}, {1}, &s), {}, 0, 0, "empty");
  EXPECT_EQ(s, (Shape{0, 5}));
  Threaded th;
  ExpectNear(SliceRun({0}, {5}, {1}, {3}, &s, th.cpu), {0, 3, 5, 8, 10, 13, 15, 18}, 0, 0, "step 3 threaded");

  OneNode t;  // a step of 0 and non-constant starts are errors
  Value* x = t.Input(MakeTensor(DType::kF32, {4}, Iota(4)));
  const std::string e0 = ErrorOf(t.Add("Slice", {}, -1, {x, t.ConstI64({0}), t.ConstI64({4}), t.ConstI64({0}), t.ConstI64({0})}));
  EXPECT_TRUE(Contains(e0, "steps")) << e0;
  Value* dyn = t.Input(MakeTensor(DType::kI64, {1}, {0}));
  const std::string e1 = ErrorOf(t.Add("Slice", {}, -1, {x, dyn, t.ConstI64({4})}));
  EXPECT_TRUE(Contains(e1, "needs a constant starts input (dynamic shapes are not supported)")) << e1;
}

TEST(Kernels, GatherNegativeIndicesAndAxis) {
  {
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {3, 2}, Iota(6)));
    t.Input(MakeTensor(DType::kI64, {2, 2}, {0, -1, 1, -3}));
    auto out = t.AddRun("Gather");
    ExpectShape(out[0], {2, 2, 2});
    ExpectNear(Values(out[0]), {0, 1, 4, 5, 2, 3, 0, 1}, 0, 0, "axis 0");
  }
  {
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 3}, Iota(6)));
    t.Input(MakeTensor(DType::kI32, {}, {-1}));
    auto out = t.AddRun("Gather", {{"axis", int64_t{-1}}});
    ExpectShape(out[0], {2});
    ExpectNear(Values(out[0]), {2, 5}, 0, 0, "scalar index axis -1");
  }
  {  // a constant index out of range fails inference; a run-time one fails the kernel
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 3}, Iota(6)));
    t.Const(MakeTensor(DType::kI64, {1}, {3}));
    EXPECT_TRUE(Contains(ErrorOf(t.Add("Gather")), "out of range"));
    OneNode r;
    r.Input(MakeTensor(DType::kF32, {2, 3}, Iota(6)));
    r.Input(MakeTensor(DType::kI64, {1}, {-3}));
    auto n = r.Add("Gather");
    ASSERT_TRUE(n.ok());
    auto res = r.Run(*n);
    ASSERT_FALSE(res.ok());
    EXPECT_TRUE(Contains(res.status().message(), "-3") && Contains(res.status().message(), "out of range"))
        << res.status().message();
  }
}

TEST(Kernels, ExpandBroadcastsBothWays) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, {3, 1}, {1, 2, 3}));
  t.ConstI64({2, 1, 4});
  auto out = t.AddRun("Expand");
  ExpectShape(out[0], {2, 3, 4});
  Vec want;
  for (int b = 0; b < 2; ++b)
    for (double v : {1, 2, 3})
      for (int k = 0; k < 4; ++k) want.push_back(v);
  ExpectNear(Values(out[0]), want, 0, 0, "expand");
  OneNode bad;
  bad.Input(MakeTensor(DType::kF32, {3}, {1, 2, 3}));
  bad.ConstI64({2});
  EXPECT_TRUE(Contains(ErrorOf(bad.Add("Expand")), "expand"));
}

// ------------------------------------------------------------------ shape ops

Shape InferredShape(const std::string& op, const Shape& in, const std::vector<int64_t>* ints, AttributeMap attrs = {},
                    std::string* error = nullptr) {
  OneNode t;
  t.Input(MakeTensor(DType::kF32, in, Vec(static_cast<size_t>(Numel(in)), 0)));
  if (ints) t.ConstI64(*ints);
  auto n = t.Add(op, std::move(attrs));
  if (error) *error = ErrorOf(n);
  if (!n.ok()) return {-1};
  EXPECT_TRUE(FindSchema(op)->view);
  return (*n)->output(0)->shape();
}

TEST(Kernels, ViewOpsInferShapes) {
  std::vector<int64_t> v;
  EXPECT_EQ(InferredShape("Reshape", {2, 3, 4}, &(v = {0, -1})), (Shape{2, 12}));
  EXPECT_EQ(InferredShape("Reshape", {2, 3, 4}, &(v = {-1})), (Shape{24}));
  EXPECT_EQ(InferredShape("Reshape", {0, 3}, &(v = {3, 0}), {{"allowzero", int64_t{1}}}), (Shape{3, 0}));
  EXPECT_EQ(InferredShape("Flatten", {2, 3, 4}, nullptr), (Shape{2, 12}));
  EXPECT_EQ(InferredShape("Flatten", {2, 3, 4}, nullptr, {{"axis", int64_t{0}}}), (Shape{1, 24}));
  EXPECT_EQ(InferredShape("Flatten", {2, 3, 4}, nullptr, {{"axis", int64_t{-1}}}), (Shape{6, 4}));
  EXPECT_EQ(InferredShape("Squeeze", {1, 3, 1, 4}, nullptr), (Shape{3, 4}));
  EXPECT_EQ(InferredShape("Squeeze", {1, 3, 1, 4}, &(v = {-2})), (Shape{1, 3, 4}));
  EXPECT_EQ(InferredShape("Unsqueeze", {3, 4}, &(v = {0, -1})), (Shape{1, 3, 4, 1}));
  EXPECT_EQ(InferredShape("Unsqueeze", {3, 4}, &(v = {1, 3})), (Shape{3, 1, 4, 1}));
  EXPECT_EQ(InferredShape("Identity", {3, 4}, nullptr), (Shape{3, 4}));
  // The opset-11 attribute forms are accepted too.
  EXPECT_EQ(InferredShape("Squeeze", {1, 3, 1}, nullptr, {{"axes", std::vector<int64_t>{0}}}), (Shape{3, 1}));
  EXPECT_EQ(InferredShape("Unsqueeze", {3}, nullptr, {{"axes", std::vector<int64_t>{-1}}}), (Shape{3, 1}));

  std::string e;
  InferredShape("Reshape", {2, 3, 4}, &(v = {-1, -1}), {}, &e);
  EXPECT_TRUE(Contains(e, "more than one -1") && Contains(e, "Reshape")) << e;
  InferredShape("Reshape", {2, 3, 4}, &(v = {5, -1}), {}, &e);
  EXPECT_TRUE(Contains(e, "[2,3,4]")) << e;
  InferredShape("Reshape", {2, 3}, &(v = {4, 2}), {}, &e);
  EXPECT_TRUE(Contains(e, "cannot reshape")) << e;
  InferredShape("Squeeze", {1, 3}, &(v = {1}), {}, &e);
  EXPECT_TRUE(Contains(e, "squeeze axis 1 of size 3")) << e;
  InferredShape("Unsqueeze", {3}, &(v = {0, 0}), {}, &e);
  EXPECT_TRUE(Contains(e, "repeat")) << e;

  OneNode t;  // a shape computed at run time
  Value* x = t.Input(MakeTensor(DType::kF32, {2, 3}, Vec(6, 0)));
  Value* s = t.Input(MakeTensor(DType::kI64, {1}, {6}));
  e = ErrorOf(t.Add("Reshape", {}, -1, {x, s}));
  EXPECT_TRUE(Contains(e, "needs a constant shape input (dynamic shapes are not supported)")) << e;

  OneNode r;  // the view keeps the bytes
  r.Input(MakeTensor(DType::kF32, {2, 3}, Iota(6)));
  r.ConstI64({3, 2});
  auto out = r.AddRun("Reshape");
  ExpectShape(out[0], {3, 2});
  ExpectNear(Values(out[0]), Iota(6), 0, 0, "reshape bytes");
}

TEST(Kernels, ShapeConstantOfShapeConstantRange) {
  {
    OneNode t;
    t.Input(MakeTensor(DType::kF32, {2, 3, 4, 5}, Vec(120, 0)));
    auto all = t.AddRun("Shape");
    EXPECT_EQ(all[0].dtype(), DType::kI64);
    ExpectNear(Values(all[0]), {2, 3, 4, 5}, 0, 0, "shape");
    auto part = t.AddRun("Shape", {{"start", int64_t{1}}, {"end", int64_t{-1}}});
    ExpectNear(Values(part[0]), {3, 4}, 0, 0, "shape[1:-1]");
    auto clamped = t.AddRun("Shape", {{"start", int64_t{-10}}, {"end", int64_t{10}}});
    ExpectNear(Values(clamped[0]), {2, 3, 4, 5}, 0, 0, "clamped");
  }
  {
    OneNode t;
    t.ConstI64({2, 3});
    auto zeros = t.AddRun("ConstantOfShape");
    EXPECT_EQ(zeros[0].dtype(), DType::kF32);
    ExpectNear(Values(zeros[0]), Vec(6, 0), 0, 0, "zeros");
    auto sevens = t.AddRun("ConstantOfShape",
                           {{"value", std::make_shared<const Tensor>(MakeTensor(DType::kI64, {1}, {7}))}});
    EXPECT_EQ(sevens[0].dtype(), DType::kI64);
    ExpectShape(sevens[0], {2, 3});
    ExpectNear(Values(sevens[0]), Vec(6, 7), 0, 0, "sevens");
  }
  {
    OneNode t;
    auto f = t.AddRun("Constant", {{"value_float", 2.5f}});
    ExpectShape(f[0], {});
    EXPECT_EQ(f[0].GetAsDouble(0), 2.5);
    auto is = t.AddRun("Constant", {{"value_ints", std::vector<int64_t>{4, -1}}});
    EXPECT_EQ(is[0].dtype(), DType::kI64);
    ExpectNear(Values(is[0]), {4, -1}, 0, 0, "value_ints");
    auto tv = t.AddRun("Constant", {{"value", std::make_shared<const Tensor>(MakeTensor(DType::kF16, {2}, {1, 2}))}});
    EXPECT_EQ(tv[0].dtype(), DType::kF16);
    ExpectNear(Values(tv[0]), {1, 2}, 0, 0, "value tensor");
    EXPECT_TRUE(Contains(ErrorOf(t.Add("Constant", {{"value_int", int64_t{1}}, {"value_float", 1.f}})), "exactly one"));
    EXPECT_TRUE(Contains(ErrorOf(t.Add("Constant")), "value"));
  }
  {
    auto range = [](DType dt, double s, double l, double d) {
      OneNode t;
      t.Const(MakeTensor(dt, {}, {s}));
      t.Const(MakeTensor(dt, {}, {l}));
      t.Const(MakeTensor(dt, {}, {d}));
      auto out = t.AddRun("Range");
      return out.empty() ? Vec{-999} : Values(out[0]);
    };
    ExpectNear(range(DType::kI64, 1, 10, 3), {1, 4, 7}, 0, 0, "int range");
    ExpectNear(range(DType::kI32, 5, 1, -2), {5, 3}, 0, 0, "negative delta");
    ExpectNear(range(DType::kI64, 5, 5, 1), {}, 0, 0, "empty");
    ExpectNear(range(DType::kF32, 0, 1, 0.25), {0, 0.25, 0.5, 0.75}, 0, 0, "float range");
    OneNode dyn;
    dyn.Input(MakeTensor(DType::kI64, {}, {0}));
    dyn.Const(MakeTensor(DType::kI64, {}, {4}));
    dyn.Const(MakeTensor(DType::kI64, {}, {1}));
    EXPECT_TRUE(Contains(ErrorOf(dyn.Add("Range")), "needs a constant start input"));
  }
}

TEST(Kernels, KernelRefusesABadAxisFromAnUntypedRewrite) {
  // AddNodeTyped skips inference; the kernel still checks the axis instead of reading out of bounds.
  OneNode t;
  Value* x = t.Input(MakeTensor(DType::kF32, {2, 3}, Iota(6)));
  Node* n = t.graph().AddNodeTyped("Softmax", {x}, {{"axis", int64_t{7}}}, {{DType::kF32, {2, 3}}});
  auto r = t.Run(n);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "axis 7")) << r.status().message();
}

TEST(Kernels, ExecutorRunsAChainWithViews) {
  // x[2,3,4] -> Reshape[6,4] -> MatMul w[4,5] -> Softmax -> Transpose -> [5,6], through Execute.
  Graph g;
  const Vec xv = RandomVec(24, 31), wv = RandomVec(20, 32);
  Value* x = g.AddInput("x", DType::kF32, {2, 3, 4}).value();
  Value* w = g.AddConstant("w", std::make_shared<const Tensor>(MakeTensor(DType::kF32, {4, 5}, wv))).value();
  Value* shape = g.AddConstant("shape", std::make_shared<const Tensor>(MakeTensor(DType::kI64, {2}, {-1, 4}))).value();
  Node* r = g.AddNode("Reshape", {x, shape}).value();
  Node* mm = g.AddNode("MatMul", {r->output(), w}).value();
  Node* sm = g.AddNode("Softmax", {mm->output()}).value();
  Node* tr = g.AddNode("Transpose", {sm->output()}).value();
  ASSERT_TRUE(g.MarkOutput(tr->output()).ok());
  ASSERT_TRUE(g.Verify().ok());
  Tensor xt = MakeTensor(DType::kF32, {2, 3, 4}, xv);
  const TensorView in[] = {xt.view()};
  auto out = Execute(g, in, CpuContext{});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectShape((*out)[0], {5, 6});
  Vec mmv, scale;
  RefMatMul(xv, {6, 4}, wv, {4, 5}, mmv, scale);
  const Vec sv = RefSoftmax(mmv, {6, 5}, -1, false);
  Vec want;
  for (int j = 0; j < 5; ++j)
    for (int i = 0; i < 6; ++i) want.push_back(sv[i * 5 + j]);
  ExpectNear(Values((*out)[0]), want, 1e-5, 1e-7, "chain");
}

TEST(Kernels, EveryScheduledOpIsRegistered) {
  for (const char* op : {"MatMul", "Gemm", "LayerNormalization", "RMSNorm", "Softmax", "LogSoftmax", "ReduceMean",
                         "ReduceSum", "ReduceMax", "Transpose", "Concat", "Split", "Slice", "Gather", "Expand",
                         "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "ConstantOfShape",
                         "Constant", "Range"}) {
    const OpSchema* s = FindSchema(op);
    ASSERT_NE(s, nullptr) << op;
    EXPECT_NE(s->infer, nullptr) << op;
    EXPECT_TRUE(s->view ? FindCpuKernel(op) == nullptr : FindCpuKernel(op) != nullptr) << op;
  }
}

// The op registry (semantics) and the CPU kernel registry agree: every op that launches (not a
// view) has a CPU kernel, and every CPU kernel runs an op the IR knows that is not a view.
TEST(Kernels, OpRegistryAndCpuKernelRegistryAgree) {
  int launched = 0;
  for (const OpSchema* s : AllSchemas()) {
    const CpuKernel* k = FindCpuKernel(s->name);
    if (s->view) {
      EXPECT_EQ(k, nullptr) << s->name << " is a view";
      continue;
    }
    ASSERT_NE(k, nullptr) << s->name << " has no CPU kernel";
    EXPECT_NE(k->run, nullptr) << s->name;
    ++launched;
  }
  const std::vector<const CpuKernel*> kernels = AllCpuKernels();
  for (const CpuKernel* k : kernels) {
    const OpSchema* s = FindSchema(k->op);
    ASSERT_NE(s, nullptr) << "CPU kernel of " << k->op << " has no schema";
    EXPECT_FALSE(s->view) << k->op;
    EXPECT_EQ(FindCpuKernel(k->op), k) << k->op;
  }
  EXPECT_EQ(static_cast<int>(kernels.size()), launched);
  EXPECT_EQ(FindCpuKernel("NoSuchOp"), nullptr);
}

}  // namespace
}  // namespace graphfuse

namespace graphfuse {
namespace {

// The scaled tile kernels (c * U(c * x) in one pass, the FusedGemm gated form under a folded
// RMSNorm) give the bits of Mul, U and Mul run one by one, for every unary f32 op of the table;
// ops of other arities have none.
TEST(ScaledTileKernel, EqualsMulOpMulForEveryUnaryOp) {
  const int64_t n = 8 * cpu::VectorLanes();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-6.f, 6.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  int checked = 0;
  for (const OpInfo& op : AllOps()) {
    const cpu::F32ScaledTileKernel scaled = cpu::GetF32ScaledTileKernel(op.kind);
    if (op.arity != 1 || op.cls == OpClass::kLogical) {
      EXPECT_TRUE(op.arity == 1 || scaled == nullptr) << op.name;
      continue;
    }
    ASSERT_NE(scaled, nullptr) << op.name;
    const OpAttrs attrs = DefaultAttrs(op.kind);
    for (const float c : {0.37f, 3.f}) {
      std::vector<float> want(x.size()), got(x.size());
      for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * c;
      const float* in[1] = {want.data()};
      cpu::GetF32TileKernel(op.kind)(in, want.data(), n, attrs, 0);
      for (float& v : want) v *= c;
      scaled(x.data(), got.data(), n, attrs, 0, c);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), x.size() * sizeof(float)), 0) << op.name << " c=" << c;
    }
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace graphfuse
