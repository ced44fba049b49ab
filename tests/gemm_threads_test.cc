// GEMM on graphfuse's pool: columns split over threads (each sgemm on its thread) give the
// same product as one thread, checked against float64, for plain and transposed B.
#include <gtest/gtest.h>

#include <random>

#include "ir/text.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

TEST(GemmThreads, ColumnSplitMatchesFloat64) {
  for (const char* op : {"MatMul", "Gemm"}) {
    const int64_t m = 37, k = 129, n = 515;
    const std::string text =
        std::string(op) == "MatMul"
            ? StrCat("graph @g(%a: f32[", m, ",", k, "], %b: f32[", k, ",", n, "]) {\n  %y = MatMul(%a, %b)\n  return %y\n}\n")
            : StrCat("graph @g(%a: f32[", m, ",", k, "], %b: f32[", n, ",", k,
                     "]) {\n  %y = Gemm(%a, %b) {transB = 1}\n  return %y\n}\n");
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Shape bshape = (*g)->inputs()[1]->shape();
    Tensor a = Tensor::Empty(DType::kF32, {m, k}).value(), b = Tensor::Empty(DType::kF32, bshape).value();
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = u(rng);
    for (int64_t i = 0; i < b.numel(); ++i) b.data_as<float>()[i] = u(rng);
    TensorView in[] = {a.view(), b.view()};
    ThreadPool pool(2);
    ExecStats st;
    auto two = Execute(**g, in, CpuContext{&pool, 2, 1024}, &st);
    ASSERT_TRUE(two.ok()) << two.status().ToString();
    const bool tb = std::string(op) == "Gemm";
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = a.data_as<float>()[i * k + p];
          const double y = tb ? b.data_as<float>()[j * k + p] : b.data_as<float>()[p * n + j];
          want += x * y, mag += std::fabs(x * y);
        }
        ASSERT_NEAR((*two)[0].data_as<float>()[i * n + j], want, 1e-5 * mag + 1e-6) << op << " at " << i << "," << j;
      }
  }
}

}  // namespace
}  // namespace graphfuse
