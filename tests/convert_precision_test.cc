// ConvertPrecision: a graph rebuilt to compute in bf16 / f16, run on the CPU (whose elementwise
// kernels load narrow dtypes and compute in f32) against the f32 graph and a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu/executor.h"
#include "graph_test_util.h"
#include "passes/convert_precision.h"

namespace graphfuse {
namespace {

// y = gelu(x * w + b) cast to f32 and back (an exporter's upcast), plus an integer path: the
// row index of each element's max over the last dim, which keeps its dtype.
std::unique_ptr<Graph> SmallModel(std::mt19937& rng) {
  auto g = std::make_unique<Graph>("small");
  std::uniform_real_distribution<float> u(-2, 2);
  auto w = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {8}).value());
  for (int64_t i = 0; i < 8; ++i) w->data_as<float>()[i] = u(rng);
  Value* x = g->AddInput("x", DType::kF32, {3, 8}).value();
  Value* wv = g->AddConstant("w", w).value();
  Value* m = g->AddNode("Mul", {x, wv}, {}, "mul").value()->output();
  Value* c = g->AddNode("Cast", {m}, {{"to", static_cast<int64_t>(DType::kF32)}}, "upcast").value()->output();
  Value* y = g->AddNode("Gelu", {c}, {}, "gelu", 1, {"y"}).value()->output();
  Value* am = g->AddNode("ArgMax", {y}, {{"axis", int64_t{1}}}, "argmax", 1, {"idx"}).value()->output();
  EXPECT_TRUE(g->MarkOutput(y).ok());
  EXPECT_TRUE(g->MarkOutput(am).ok());
  return g;
}

TEST(ConvertPrecision, ModelComputesInNarrowDTypesWithItsInterfaceKept) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    std::mt19937 rng(3);
    auto src = SmallModel(rng);
    auto narrow = ConvertPrecision(*src, dt);
    ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
    const Graph& g = **narrow;
    ASSERT_TRUE(g.Verify().ok()) << g.Verify().ToString();
    // The interface is the model's: names and dtypes of inputs and outputs.
    ASSERT_EQ(g.inputs().size(), 1u);
    EXPECT_EQ(g.inputs()[0]->dtype(), DType::kF32);
    ASSERT_EQ(g.outputs().size(), 2u);
    EXPECT_EQ(g.outputs()[0]->name(), "y");
    EXPECT_EQ(g.outputs()[0]->dtype(), DType::kF32);
    EXPECT_EQ(g.outputs()[1]->name(), "idx");
    EXPECT_EQ(g.outputs()[1]->dtype(), DType::kI64);
    // Inside, the weights and every float value are narrow, the upcast included.
    EXPECT_EQ(g.FindValue("w")->dtype(), dt);
    for (const auto& n : g.nodes())
      if (n->op() == "Mul" || n->op() == "Gelu" || n->name() == "upcast") {
        EXPECT_EQ(n->output()->dtype(), dt) << n->name();
      }
    // On random inputs: close to the f32 graph and to float64, within the dtype's rounding.
    std::uniform_real_distribution<float> u(-2, 2);
    Tensor x = Tensor::Empty(DType::kF32, {3, 8}).value();
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = u(rng);
    const std::vector<TensorView> in = {x.view()};
    auto want = Execute(*src, in, CpuContext{});
    auto got = Execute(g, in, CpuContext{});
    ASSERT_TRUE(want.ok() && got.ok());
    const float* got_y = (*got)[0].data_as<float>();
    const float* want_y = (*want)[0].data_as<float>();
    const double tol = dt == DType::kBF16 ? 3e-2 : 4e-3;
    const Tensor* w = src->FindValue("w")->constant().get();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = double(x.data_as<float>()[i]) * w->data_as<float>()[i % 8];
      const double ref = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      EXPECT_NEAR(got_y[i], ref, tol * (1 + std::fabs(ref))) << i;
      EXPECT_NEAR(want_y[i], ref, 1e-5 * (1 + std::fabs(ref))) << i;
    }
    // The integer output keeps its dtype.
    EXPECT_EQ((*got)[1].dtype(), DType::kI64);
  }
}

TEST(ConvertPrecision, NarrowIoMovesTheInterfaceToTheDTypeWithoutCasts) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    std::mt19937 rng(5);
    auto src = SmallModel(rng);
    auto narrow = ConvertPrecision(*src, dt, {.narrow_io = true});
    ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
    const Graph& g = **narrow;
    ASSERT_TRUE(g.Verify().ok());
    EXPECT_EQ(g.inputs()[0]->name(), "x");
    EXPECT_EQ(g.inputs()[0]->dtype(), dt);
    EXPECT_EQ(g.outputs()[0]->name(), "y");
    EXPECT_EQ(g.outputs()[0]->dtype(), dt);
    EXPECT_EQ(g.outputs()[1]->dtype(), DType::kI64);
    // Only the exporter's upcast is a Cast; the edges have none.
    int casts = 0;
    for (const auto& n : g.nodes()) casts += n->op() == "Cast";
    EXPECT_EQ(casts, 1);
    // Same numbers as the edge-cast form on inputs the dtype holds exactly.
    auto edges = ConvertPrecision(*src, dt);
    ASSERT_TRUE(edges.ok());
    std::uniform_real_distribution<float> u(-2, 2);
    Tensor x = Tensor::Empty(DType::kF32, {3, 8}).value();
    Tensor xn = Tensor::Empty(dt, {3, 8}).value();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const uint16_t b = dt == DType::kBF16 ? F32ToBF16Bits(u(rng)) : F32ToF16Bits(u(rng));
      xn.data_as<uint16_t>()[i] = b;
      x.data_as<float>()[i] = dt == DType::kBF16 ? BF16BitsToF32(b) : F16BitsToF32(b);
    }
    const std::vector<TensorView> in = {x.view()}, in_n = {xn.view()};
    auto want = Execute(**edges, in, CpuContext{});
    auto got = Execute(g, in_n, CpuContext{});
    ASSERT_TRUE(want.ok() && got.ok());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const uint16_t b = (*got)[0].data_as<uint16_t>()[i];
      EXPECT_EQ(dt == DType::kBF16 ? BF16BitsToF32(b) : F16BitsToF32(b), (*want)[0].data_as<float>()[i]) << i;
    }
  }
}

TEST(ConvertPrecision, F32IsACopyAndOtherDTypesAreRefused) {
  std::mt19937 rng(4);
  auto src = SmallModel(rng);
  auto same = ConvertPrecision(*src, DType::kF32);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ((*same)->num_nodes(), src->num_nodes());
  EXPECT_EQ((*same)->FindValue("w")->dtype(), DType::kF32);
  auto bad = ConvertPrecision(*src, DType::kI32);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graphfuse
