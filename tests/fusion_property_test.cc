// Random-graph property test: hundreds of generated DAGs of elementwise ops with broadcast
// operands, diamonds, multi-consumer values, non-elementwise nodes in between (cycle bait)
// and mixed dtypes. For each: the fused graph verifies (so it is acyclic and well typed), and
// fused == unfused bit for bit on fresh random inputs (same primitives, same order).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <random>

#include "graphfuse/cpu_codegen.h"
#include "ir/text.h"
#include "passes/fuse_elementwise.h"
#include "runtime/executor.h"

namespace graphfuse {
namespace {

struct Generated {
  std::unique_ptr<Graph> graph;
  std::string text;
};

// Builds one random graph through the textual IR (so a failure prints a reproducible graph).
std::string RandomGraphText(std::mt19937& rng, DType dt) {
  const int64_t rows = 1 + rng() % 9, cols = 1 + rng() % 300;
  const std::string t = DTypeName(dt);
  const bool ints = !IsFloat(dt);
  const std::vector<std::string> shapes = {StrCat("[", rows, ",", cols, "]"), StrCat("[", cols, "]"),
                                           StrCat("[1,", cols, "]"), StrCat("[", rows, ",1]"), "[]"};
  std::string s = "graph @random(";
  std::vector<std::string> full;  // values of the full [rows, cols] shape
  std::vector<std::string> any;   // any value (broadcast operands)
  const int n_inputs = 2 + rng() % 4;
  for (int i = 0; i < n_inputs; ++i) {
    const std::string shape = i == 0 ? shapes[0] : shapes[rng() % shapes.size()];
    s += StrCat(i ? ", " : "", "%in", i, ": ", t, shape);
    any.push_back(StrCat("in", i));
    if (shape == shapes[0]) full.push_back(StrCat("in", i));
  }
  s += ") {\n";
  const std::vector<std::string> unary = ints ? std::vector<std::string>{"Neg", "Abs", "Relu"}
                                              : std::vector<std::string>{"Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Gelu",
                                                                         "Silu", "Relu", "Erf", "Softplus"};
  const std::vector<std::string> binary = ints ? std::vector<std::string>{"Add", "Sub", "Mul", "Max", "Min"}
                                               : std::vector<std::string>{"Add", "Sub", "Mul", "Div", "Max", "Min"};
  const int n_nodes = 3 + rng() % 14;
  int k = 0;
  auto pick = [&](const std::vector<std::string>& from) { return from[rng() % from.size()]; };
  for (int i = 0; i < n_nodes; ++i) {
    const std::string name = StrCat("v", k++);
    const int kind = rng() % 10;
    if (kind < 4) {
      s += StrCat("  %", name, " = ", pick(unary), "(%", pick(full), ")\n");
    } else if (kind < 8) {
      // A full operand and any operand (broadcast), in either order.
      std::string a = pick(full), b = pick(any);
      if (rng() & 1) std::swap(a, b);
      s += StrCat("  %", name, " = ", pick(binary), "(%", a, ", %", b, ")\n");
    } else if (kind == 8) {
      const std::string c = StrCat("c", k++);
      s += StrCat("  %", c, " = Less(%", pick(full), ", %", pick(any), ")\n");
      s += StrCat("  %", name, " = Where(%", c, ", %", pick(full), ", %", pick(any), ")\n");
    } else {
      // A non-elementwise node between elementwise ones (f32 only: MatMul is f32).
      if (dt == DType::kF32) {
        const std::string w = StrCat("w", k++);
        s += StrCat("  %", w, ": f32[", cols, ",", cols, "] = const [");
        for (int64_t e = 0; e < cols * cols; ++e) s += StrCat(e ? ", " : "", (e % (cols + 1)) ? 0.0 : 0.5);
        s += "]\n";
        s += StrCat("  %", name, " = MatMul(%", pick(full), ", %", w, ")\n");
      } else {
        s += StrCat("  %", name, " = Neg(%", pick(full), ")\n");
      }
    }
    full.push_back(name);
    any.push_back(name);
  }
  // Outputs: the last value and a few random earlier ones (multi-consumer, several outputs).
  std::set<std::string> outs = {full.back()};
  for (int i = 0; i < 2; ++i)
    if (rng() % 2) outs.insert(pick(full));
  s += "  return";
  bool first = true;
  for (const std::string& o : outs) {
    s += StrCat(first ? " %" : ", %", o);
    first = false;
  }
  return s + "\n}\n";
}

std::vector<Tensor> RandomInputs(const Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-3, 3);
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs()) {
    Tensor t = Tensor::Empty(v->dtype(), v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, IsFloat(v->dtype()) ? u(rng) : double(rng() % 41) - 20);
    ins.push_back(std::move(t));
  }
  return ins;
}

TEST(FusionProperty, RandomGraphsFuseToTheSameBits) {
  std::mt19937 rng(20261202);
  ThreadPool pool(2);
  const CpuContext ctx{&pool, 2, 4096};
  int fused_groups = 0, graphs = 0, graphs_with_groups = 0;
  // The kernel cache of this process only, removed afterwards.
  const std::filesystem::path cache = std::filesystem::temp_directory_path() / StrCat("graphfuse_property_", getpid());
  auto codegen = CpuCodegen::Create({.cache_dir = cache.string()});
  ASSERT_TRUE(codegen.ok()) << codegen.status().ToString();
  for (int iter = 0; iter < 400; ++iter) {
    const DType dt = std::vector<DType>{DType::kF32, DType::kF32, DType::kF16, DType::kBF16, DType::kI32}[iter % 5];
    const std::string text = RandomGraphText(rng, dt);
    auto unfused = ParseGraph(text);
    ASSERT_TRUE(unfused.ok()) << unfused.status().ToString() << "\n" << text;
    auto fused = ParseGraph(text).value();
    FusionOptions o;
    o.max_group_size = 1 + rng() % 24;  // caps split groups in every possible place
    auto rep = FuseElementwise(*fused, o);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString() << "\n" << text;
    ASSERT_TRUE(fused->Verify().ok()) << fused->Verify().ToString() << "\n" << text;
    ASSERT_TRUE(fused->TopologicalSort().ok()) << text;
    EXPECT_EQ(rep->kernels_after, CountKernels(*fused));
    EXPECT_LE(rep->kernels_after, rep->kernels_before);
    fused_groups += static_cast<int>(rep->groups.size());
    graphs_with_groups += rep->groups.empty() ? 0 : 1;
    ++graphs;
    const std::vector<Tensor> ins = RandomInputs(**unfused, rng);
    std::vector<TensorView> views;
    for (const Tensor& t : ins) views.push_back(t.view());
    auto a = Execute(**unfused, views, ctx);
    auto b = Execute(*fused, views, ctx);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " / " << b.status().ToString() << "\n" << text;
    for (size_t k = 0; k < a->size(); ++k)
      ASSERT_EQ(0, std::memcmp((*a)[k].data(), (*b)[k].data(), (*a)[k].nbytes()))
          << "output " << k << " differs\n" << text << "\nfused:\n" << PrintGraph(*fused);
    // The first f32, f16 and bf16 graphs once more with the groups compiled to native loops
    // (~2 s a kernel).
    if (IsFloat(dt) && iter < 25) {
      CpuContext native = ctx;
      native.codegen = codegen->get();
      auto c = Execute(*fused, views, native);
      ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << text;
      for (size_t k = 0; k < a->size(); ++k)
        ASSERT_EQ(0, std::memcmp((*a)[k].data(), (*c)[k].data(), (*a)[k].nbytes()))
            << "output " << k << " differs with native loops\n" << text << "\nfused:\n" << PrintGraph(*fused);
    }
  }
  {
    const CpuCodegen::Stats cs = (*codegen)->stats();
    std::string why;
    for (const auto& [reason, count] : cs.outside_why) why += StrCat(" ", count, " with ", reason, ";");
    std::printf("  native loops: %d compiled, %d from the cache, %d programs outside the scope (%s), %d failed\n",
                cs.compiled, cs.loaded, cs.outside_scope, why.c_str(), cs.failed);
    EXPECT_GT(cs.compiled + cs.loaded, 5);
    EXPECT_EQ(cs.failed, 0) << cs.last_error;
  }
  std::printf("  %d random graphs (%d with fused groups), %d fused groups, all bit-identical to unfused\n", graphs,
              graphs_with_groups, fused_groups);
  EXPECT_GT(graphs_with_groups, graphs / 2);  // the generator must actually give the planner work
  std::error_code ec;
  std::filesystem::remove_all(cache, ec);
}

}  // namespace
}  // namespace graphfuse
