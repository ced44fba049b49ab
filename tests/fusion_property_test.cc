// Random-graph property test: a thousand generated DAGs of elementwise ops (RandomGraphText
// says what they hold), each fused under random caps. For each: fusion succeeds, the fused
// graph verifies (so it is acyclic and well typed), and fused == unfused bit for bit on fresh
// random inputs (same primitives, same order). With the planner's cycle check on node paths
// only (before group paths), 1 graph in about 100 of this generator made a cycle; the default
// seed's first such graph is number 151.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <map>
#include <random>
#include <set>

#include "graphfuse/cpu_codegen.h"
#include "ir/text.h"
#include "passes/fuse_elementwise.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

struct Generated {
  std::unique_ptr<Graph> graph;
  std::string text;
};

// Builds one random graph through the textual IR (so a failure prints a reproducible graph).
// What it draws, each the bait of a way a planner can go wrong:
//   - a full iteration space of rank 2 or 3, operands of every rank that broadcasts to it,
//     scalar graph inputs among them;
//   - values computed in a lower-rank space and read by full-space ops (diamonds across
//     broadcast ranks: the two spaces cannot share a group);
//   - bool values from comparisons read by Where, by Cast (which computes in integers, so it
//     cannot join a float group) and by Not;
//   - nodes that are not elementwise between elementwise ones: MatMul, and reductions over the
//     last axis whose [..., 1] results come back as broadcast operands;
//   - one to four graph outputs (a value read by a group and also written out).
// Groups that no node path joins may still close a cycle through a third group; graphs of
// this kind are what catches a planner that checks node paths only.
std::string RandomGraphText(std::mt19937& rng, DType dt) {
  const int64_t batch = 1 + rng() % 3, rows = 1 + rng() % 9, cols = 1 + rng() % 300;
  const bool rank3 = rng() % 3 == 0;
  const std::string t = DTypeName(dt);
  const bool ints = !IsFloat(dt);
  const std::string full_shape = rank3 ? StrCat("[", batch, ",", rows, ",", cols, "]") : StrCat("[", rows, ",", cols, "]");
  std::vector<std::string> shapes = {full_shape, StrCat("[", cols, "]"), StrCat("[1,", cols, "]"), StrCat("[", rows, ",1]"), "[]"};
  if (rank3)
    for (const std::string& sh : {StrCat("[", rows, ",", cols, "]"), StrCat("[", batch, ",1,1]"),
                                  StrCat("[", batch, ",1,", cols, "]"), StrCat("[1,", rows, ",1]")})
      shapes.push_back(sh);
  std::string header = "graph @random(", s;  // the inputs, the body
  std::vector<std::string> full;   // values of the full shape
  std::vector<std::string> any;    // any value of the graph's dtype (broadcast operands)
  std::vector<std::string> small;  // values of a lower-rank or smaller shape
  std::map<std::string, std::string> shape_of;
  std::vector<std::string> bools;  // comparison results
  const int n_inputs = 2 + rng() % 4;
  for (int i = 0; i < n_inputs; ++i) {
    // The first input is full; a scalar input half the time, else any shape.
    const std::string shape = i == 0 ? full_shape : (i == 1 && rng() % 2) ? "[]" : shapes[rng() % shapes.size()];
    const std::string name = StrCat("in", i);
    header += StrCat(i ? ", " : "", "%", name, ": ", t, shape);
    any.push_back(name);
    shape_of[name] = shape;
    (shape == full_shape ? full : small).push_back(name);
  }
  const std::vector<std::string> unary = ints ? std::vector<std::string>{"Neg", "Abs", "Relu"}
                                              : std::vector<std::string>{"Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Gelu",
                                                                         "Silu", "Relu", "Erf", "Softplus"};
  const std::vector<std::string> binary = ints ? std::vector<std::string>{"Add", "Sub", "Mul", "Max", "Min"}
                                               : std::vector<std::string>{"Add", "Sub", "Mul", "Div", "Max", "Min"};
  const int dtype_code = static_cast<int>(dt);
  const int n_nodes = 3 + rng() % 40;
  int k = 0;
  // Half the picks take one of the last few values: chains, diamonds and groups that meet.
  auto pick = [&](const std::vector<std::string>& from) {
    const size_t n = from.size(), window = std::min<size_t>(n, 4);
    return rng() % 2 ? from[n - 1 - rng() % window] : from[rng() % n];
  };
  auto add = [&](const std::string& name, const std::string& shape) {
    shape_of[name] = shape;
    any.push_back(name);
    (shape == full_shape ? full : small).push_back(name);
  };
  auto add_compare = [&] {
    const std::string c = StrCat("c", k++);
    std::string a = pick(full), b = pick(any);
    if (rng() & 1) std::swap(a, b);
    s += StrCat("  %", c, " = ", rng() % 2 ? "Less" : "Greater", "(%", a, ", %", b, ")\n");
    bools.push_back(c);
    return c;
  };
  for (int i = 0; i < n_nodes; ++i) {
    const std::string name = StrCat("v", k++);
    const int kind = rng() % 12;
    if (kind < 3) {
      s += StrCat("  %", name, " = ", pick(unary), "(%", pick(full), ")\n");
      add(name, full_shape);
    } else if (kind == 3 && !small.empty()) {
      // A value in a lower-rank space, read later by full-space ops.
      const std::string x = pick(small);
      s += StrCat("  %", name, " = ", pick(unary), "(%", x, ")\n");
      add(name, shape_of[x]);
    } else if (kind < 7) {
      // A full operand and any operand (broadcast), in either order.
      std::string a = pick(full), b = pick(any);
      if (rng() & 1) std::swap(a, b);
      s += StrCat("  %", name, " = ", pick(binary), "(%", a, ", %", b, ")\n");
      add(name, full_shape);
    } else if (kind == 7) {
      const std::string c = add_compare();
      std::string a = pick(full), b = pick(any);
      if (rng() & 1) std::swap(a, b);
      s += StrCat("  %", name, " = Where(%", c, ", %", a, ", %", b, ")\n");
      add(name, full_shape);
    } else if (kind == 8) {
      // An earlier comparison read again: by Cast (an integer-domain op) or by Where, and
      // sometimes negated first.
      std::string c = bools.empty() ? add_compare() : pick(bools);
      if (rng() % 3 == 0) {
        const std::string n = StrCat("c", k++);
        s += StrCat("  %", n, " = Not(%", c, ")\n");
        bools.push_back(n);
        c = n;
      }
      if (rng() % 2) {
        s += StrCat("  %", name, " = Cast(%", c, ") {to = ", dtype_code, "}\n");
      } else {
        s += StrCat("  %", name, " = Where(%", c, ", %", pick(any), ", %", pick(full), ")\n");
      }
      add(name, full_shape);
    } else if (kind == 9 || kind == 10) {
      // A reduction over the last axis; its [..., 1] result is a broadcast operand later.
      const char* op = ints ? "ReduceSum" : std::vector<const char*>{"ReduceSum", "ReduceMean", "ReduceMax"}[rng() % 3];
      s += StrCat("  %", name, " = ", op, "(%", pick(full), ") {axes = [-1], keepdims = 1}\n");
      add(name, rank3 ? StrCat("[", batch, ",", rows, ",1]") : StrCat("[", rows, ",1]"));
    } else {
      // A MatMul between elementwise ones (f32 only: MatMul is f32).
      if (dt == DType::kF32) {
        // The weights are a graph input: random, and no constant to print and parse.
        const std::string w = StrCat("w", k++);
        header += StrCat(", %", w, ": f32[", cols, ",", cols, "]");
        s += StrCat("  %", name, " = MatMul(%", pick(full), ", %", w, ")\n");
      } else {
        s += StrCat("  %", name, " = Neg(%", pick(full), ")\n");
      }
      add(name, full_shape);
    }
  }
  // Outputs: the last full value and up to three others of any kind (values also read inside
  // a group, bools, reductions' results, lower-rank values).
  std::set<std::string> outs = {full.back()};
  std::vector<std::string> computed;
  for (const std::string& v : any)
    if (v.rfind("in", 0) != 0) computed.push_back(v);
  for (const std::string& b : bools) computed.push_back(b);
  for (int i = 0; i < 3; ++i)
    if (rng() % 2) outs.insert(pick(computed));
  s += "  return";
  bool first = true;
  for (const std::string& o : outs) {
    s += StrCat(first ? " %" : ", %", o);
    first = false;
  }
  return header + ") {\n" + s + "\n}\n";
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

// Graphs per run, and the seed: GF_PROPERTY_GRAPHS / GF_PROPERTY_SEED override them (to search
// longer or to replay a run; CI runs the defaults).
int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
constexpr int kGraphs = 1000;

TEST(FusionProperty, RandomGraphsFuseToTheSameBits) {
  const int seed = EnvInt("GF_PROPERTY_SEED", 20261202);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int n_graphs = EnvInt("GF_PROPERTY_GRAPHS", kGraphs);
  ThreadPool pool(2);
  const CpuContext ctx{&pool, 2, 4096};
  int fused_groups = 0, graphs = 0, graphs_with_groups = 0;
  // The kernel cache of this process only, removed afterwards.
  const std::filesystem::path cache = std::filesystem::temp_directory_path() / StrCat("graphfuse_property_", getpid());
  auto codegen = CpuCodegen::Create({.cache_dir = cache.string()});
  ASSERT_TRUE(codegen.ok()) << codegen.status().ToString();
  for (int iter = 0; iter < n_graphs; ++iter) {
    const DType dt = std::vector<DType>{DType::kF32, DType::kF32, DType::kF16, DType::kBF16, DType::kI32}[iter % 5];
    SCOPED_TRACE(StrCat("random graph ", iter, " of seed ", seed));
    const std::string text = RandomGraphText(rng, dt);
    auto unfused = ParseGraph(text);
    ASSERT_TRUE(unfused.ok()) << unfused.status().ToString() << "\n" << text;
    auto fused = ParseGraph(text).value();
    FusionOptions o;
    // Caps split groups in every possible place; a split leaves groups side by side that a
    // later merge must not join into a cycle.
    o.max_group_size = 1 + rng() % 24;
    o.max_inputs = 2 + rng() % (rng() % 2 ? 4 : 11);
    o.max_outputs = 1 + rng() % 6;
    SCOPED_TRACE(StrCat("max_group_size ", o.max_group_size, ", max_inputs ", o.max_inputs, ", max_outputs ",
                        o.max_outputs));
    auto rep = FuseElementwise(*fused, o);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString() << "\n" << text;
    ASSERT_TRUE(fused->Verify().ok()) << fused->Verify().ToString() << "\n" << text;
    ASSERT_TRUE(fused->TopologicalSort().ok()) << text;
    {
      // The same plan from another copy of the graph (other addresses): planning is deterministic.
      auto again = ParseGraph(text).value();
      ASSERT_TRUE(FuseElementwise(*again, o).ok()) << text;
      ASSERT_EQ(PrintGraph(*again), PrintGraph(*fused)) << text;
    }
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
    // The first f32, f16 and bf16 graphs once more with the groups compiled to native loops,
    // until 16 kernels have been compiled (~1-2 s a kernel).
    if (IsFloat(dt) && (*codegen)->stats().compiled < 16) {
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
