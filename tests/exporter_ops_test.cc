// The ops model exporters emit beyond the core set: the remaining reductions, CumSum, GatherND,
// ScatterND, Tile, Pad and TopK. Each runs as a one-node graph on random non-zero data against
// a float64 (or index) reference written here, in every dtype it takes, on one thread and on
// two; bad input gets an error naming the op, the shapes and the offending value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/executor.h"
#include "graphfuse/cpu.h"
#include "graphfuse/graph.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse {
namespace {

using Vec = std::vector<double>;

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A tensor of `dtype` holding `values` (rounded to the dtype as its store rounds them).
Tensor Make(DType dtype, const Shape& shape, const Vec& values) {
  Tensor t = Tensor::Empty(dtype, shape).value();
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, values[i]);
  return t;
}

Tensor Ints(const std::vector<int64_t>& v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Make(DType::kI64, shape, Vec(v.begin(), v.end()));
}

Vec Values(const Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.GetAsDouble(i);
  return v;
}

// Uniform in [lo, hi], never 0, as the dtype stores it.
Vec Random(int64_t n, uint32_t seed, double lo, double hi, DType dtype = DType::kF32) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) {
    do x = d(rng);
    while (x == 0);
    if (!IsFloat(dtype)) x = std::round(x);
    if (x == 0) x = 1;
  }
  return Values(Make(dtype, {n}, v));
}

// Relative tolerance of one rounding to `dtype` (results computed in double, then stored).
double Rtol(DType dtype) {
  if (dtype == DType::kF16) return 1e-3;
  if (dtype == DType::kBF16) return 8e-3;
  if (dtype == DType::kF32) return 1e-6;
  return 0;
}

void ExpectNear(const Vec& got, const Vec& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = (std::isnan(want[i]) && std::isnan(got[i])) || got[i] == want[i] ||
                    std::fabs(got[i] - want[i]) <= rtol * std::fabs(want[i]) + 1e-30;
    if (!ok && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
  }
}

// A context that splits every launch over 2 threads.
struct Threaded {
  ThreadPool pool{2};
  CpuContext cpu{&pool, 0, 1};
};

// One node: graph inputs fed with the given tensors (nullptr for an omitted optional input),
// constants, attributes. Runs it with Execute.
class OneOp {
 public:
  Value* In(Tensor t) {
    Value* v = g_.AddInput(g_.FreshName("in"), t.dtype(), t.shape()).value();
    feeds_.push_back(std::move(t));
    return v;
  }
  Value* Const(Tensor t) {
    return g_.AddConstant(g_.FreshName("c"), std::make_shared<const Tensor>(std::move(t))).value();
  }
  // Adds the node; its outputs become the graph's.
  Result<Node*> Add(const std::string& op, const std::vector<Value*>& ins, AttributeMap attrs = {},
                    int num_outputs = 1) {
    GF_ASSIGN_OR_RETURN(Node * n, g_.AddNode(op, ins, std::move(attrs), "node", num_outputs));
    for (Value* o : n->outputs()) GF_RETURN_IF_ERROR(g_.MarkOutput(o));
    return n;
  }
  Result<std::vector<Tensor>> Run(const CpuContext& cpu = CpuContext{}) {
    std::vector<TensorView> views;
    for (const Tensor& t : feeds_) views.push_back(t.view());
    return Execute(g_, views, cpu);
  }
  // Add + Run, failing the test on an error.
  std::vector<Tensor> AddRun(const std::string& op, const std::vector<Value*>& ins, AttributeMap attrs = {},
                             int num_outputs = 1, const CpuContext& cpu = CpuContext{}) {
    auto n = Add(op, ins, std::move(attrs), num_outputs);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return {};
    auto r = Run(cpu);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : std::vector<Tensor>{};
  }

 private:
  Graph g_;
  std::vector<Tensor> feeds_;
};

std::string ErrorOf(const Result<Node*>& r) { return r.ok() ? std::string("<ok>") : r.status().ToString(); }
std::string ErrorOf(const Result<std::vector<Tensor>>& r) { return r.ok() ? std::string("<ok>") : r.status().ToString(); }
bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Row-major index of `idx` in `shape`.
int64_t Offset(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t o = 0;
  for (size_t d = 0; d < shape.size(); ++d) o = o * shape[d] + idx[d];
  return o;
}

// The multi-index of flat position i in `shape`.
std::vector<int64_t> Unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) idx[d] = i % shape[d], i /= shape[d];
  return idx;
}

// ------------------------------------------------------------------ reductions

// The reduction of `values` as ONNX defines `op`, in double.
double Reduce(const std::string& op, const Vec& v) {
  double r = 0;
  if (op == "ReduceMin") {
    r = INFINITY;
    for (double x : v) r = std::isnan(x) || std::isnan(r) ? NAN : std::min(r, x);
  } else if (op == "ReduceProd") {
    r = 1;
    for (double x : v) r *= x;
  } else if (op == "ReduceSumSquare" || op == "ReduceL2") {
    for (double x : v) r += x * x;
    if (op == "ReduceL2") r = std::sqrt(r);
  } else if (op == "ReduceL1") {
    for (double x : v) r += std::fabs(x);
  } else if (op == "ReduceLogSum") {
    for (double x : v) r += x;
    r = std::log(r);
  } else if (op == "ReduceLogSumExp") {
    double m = -INFINITY;
    for (double x : v) m = std::max(m, x);
    for (double x : v) r += std::exp(x - m);
    r = m + std::log(r);
  }
  return r;
}

// Reduces x (shape s) over `axes` (normalized), keeping dims of 1.
Vec RefReduce(const std::string& op, const Vec& x, const Shape& s, const std::vector<int64_t>& axes) {
  Shape out = s;
  for (int64_t a : axes) out[a] = 1;
  std::vector<Vec> groups(static_cast<size_t>(Numel(out)));
  for (int64_t i = 0; i < Numel(s); ++i) {
    std::vector<int64_t> idx = Unravel(i, s);
    for (int64_t a : axes) idx[a] = 0;
    groups[Offset(idx, out)].push_back(x[i]);
  }
  Vec r;
  for (const Vec& g : groups) r.push_back(Reduce(op, g));
  return r;
}

TEST(ExporterOps, ReductionsMatchFloat64InEveryDtype) {
  const Shape s = {3, 4, 5};
  Threaded th;
  const std::vector<std::vector<int64_t>> axes_cases = {{}, {-1}, {0}, {0, 2}, {1}, {0, 1, 2}};
  for (const char* op : {"ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp"}) {
    const bool ints = std::string(op) != "ReduceL2" && std::string(op) != "ReduceLogSum" &&
                      std::string(op) != "ReduceLogSumExp";
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
      if (!IsFloat(dt) && !ints) continue;
      // Products stay near 1 in magnitude; LogSum needs positive sums.
      double lo = -2, hi = 2;
      if (std::string(op) == "ReduceProd") lo = IsFloat(dt) ? 0.7 : -2, hi = IsFloat(dt) ? 1.4 : 2;
      if (std::string(op) == "ReduceLogSum") lo = 0.1;
      if (!IsFloat(dt) && std::string(op) != "ReduceProd") lo *= 5, hi *= 5;  // products of +-1, +-2 stay exact
      const Vec x = Random(Numel(s), 3, lo, hi, dt);
      for (const auto& axes : axes_cases) {
        for (bool as_input : {false, true}) {
          SCOPED_TRACE(StrCat(op, " ", DTypeName(dt), " axes=", ShapeToString(axes), " as_input=", as_input));
          OneOp t;
          std::vector<Value*> ins = {t.In(Make(dt, s, x))};
          AttributeMap attrs = {{"keepdims", int64_t{1}}};
          if (as_input && !axes.empty()) ins.push_back(t.Const(Ints(axes)));
          else if (!axes.empty()) attrs["axes"] = axes;
          auto out = t.AddRun(op, ins, attrs, 1, as_input ? th.cpu : CpuContext{});
          ASSERT_EQ(out.size(), 1u);
          std::vector<int64_t> norm;
          for (int64_t a : axes) norm.push_back(a < 0 ? a + 3 : a);
          if (norm.empty()) norm = {0, 1, 2};
          Vec want = RefReduce(op, x, s, norm);
          if (!IsFloat(dt))  // integer results wrap to the dtype, as the stores keep them
            for (double& w : want) w = dt == DType::kI32 ? static_cast<int32_t>(static_cast<int64_t>(w)) : w;
          ExpectNear(Values(out[0]), want, Rtol(dt), op);
        }
      }
    }
  }
}

TEST(ExporterOps, ReductionEdgeCases) {
  {  // log-sum-exp of large values does not overflow; of -inf only, -inf
    OneOp t;
    Value* x = t.In(Make(DType::kF32, {2, 3}, {1000, 1000, 999, -INFINITY, -INFINITY, -INFINITY}));
    auto out = t.AddRun("ReduceLogSumExp", {x}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_NEAR(out[0].GetAsDouble(0), 1000 + std::log(2 + std::exp(-1.0)), 1e-4);
    EXPECT_EQ(out[0].GetAsDouble(1), -INFINITY);
  }
  {  // ReduceMin propagates NaN; reductions over an empty dim give their identities
    OneOp t;
    Value* x = t.In(Make(DType::kF32, {2, 2}, {1, NAN, 3, -4}));
    auto out = t.AddRun("ReduceMin", {x}, {{"axes", std::vector<int64_t>{1}}});
    EXPECT_TRUE(std::isnan(out[0].GetAsDouble(0)));
    EXPECT_EQ(out[0].GetAsDouble(1), -4);
  }
  for (const auto& [op, want] : std::vector<std::pair<std::string, double>>{
           {"ReduceMin", INFINITY}, {"ReduceProd", 1}, {"ReduceSumSquare", 0}, {"ReduceL2", 0},
           {"ReduceLogSum", -INFINITY}, {"ReduceLogSumExp", -INFINITY}}) {
    OneOp t;
    Value* x = t.In(Tensor::Empty(DType::kF32, {2, 0}).value());
    auto out = t.AddRun(op, {x}, {{"axes", std::vector<int64_t>{1}}});
    ASSERT_EQ(out.size(), 1u) << op;
    EXPECT_EQ(out[0].GetAsDouble(0), want) << op;
  }
  {  // the integer ReduceMin of nothing is the type's largest value
    OneOp t;
    Value* x = t.In(Tensor::Empty(DType::kI32, {0, 2}).value());
    auto out = t.AddRun("ReduceMin", {x}, {{"axes", std::vector<int64_t>{0}}});
    EXPECT_EQ(out[0].GetAsDouble(0), std::numeric_limits<int32_t>::max());
  }
  {  // the root and log reductions refuse integers, naming the op
    OneOp t;
    Value* x = t.In(Make(DType::kI32, {2}, {1, 2}));
    const std::string e = ErrorOf(t.Add("ReduceL2", {x}));
    EXPECT_TRUE(Contains(e, "ReduceL2 on i32 is not supported")) << e;
  }
}

// ------------------------------------------------------------------ CumSum

Vec RefCumSum(const Vec& x, const Shape& s, int64_t axis, bool exclusive, bool reverse) {
  Vec out(x.size());
  for (int64_t i = 0; i < Numel(s); ++i) {
    std::vector<int64_t> idx = Unravel(i, s);
    const int64_t at = idx[axis];
    double sum = 0;
    for (int64_t j = 0; j < s[axis]; ++j) {
      const bool in = reverse ? (exclusive ? j > at : j >= at) : (exclusive ? j < at : j <= at);
      idx[axis] = j;
      if (in) sum += x[Offset(idx, s)];
    }
    out[i] = sum;
  }
  return out;
}

TEST(ExporterOps, CumSumMatchesFloat64) {
  Threaded th;
  for (const Shape& s : {Shape{3, 4, 5}, Shape{2, 3, 300}}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
      const Vec x = Random(Numel(s), 5, IsFloat(dt) ? -2 : -50, IsFloat(dt) ? 2 : 50, dt);
      for (int64_t axis : {0, 1, 2, -1}) {
        for (int flags = 0; flags < 4; ++flags) {
          const bool exclusive = flags & 1, reverse = flags & 2;
          // The axis as a constant, and as an i32 value known only at run time.
          for (bool runtime_axis : {false, true}) {
            SCOPED_TRACE(StrCat("CumSum ", DTypeName(dt), ShapeToString(s), " axis=", axis, " exclusive=", exclusive,
                                " reverse=", reverse, " runtime_axis=", runtime_axis));
            OneOp t;
            Value* xv = t.In(Make(dt, s, x));
            Value* av = runtime_axis ? t.In(Make(DType::kI32, {}, {static_cast<double>(axis)}))
                                     : t.Const(Make(DType::kI64, {}, {static_cast<double>(axis)}));
            auto out = t.AddRun("CumSum", {xv, av}, {{"exclusive", int64_t{exclusive}}, {"reverse", int64_t{reverse}}},
                                1, runtime_axis ? th.cpu : CpuContext{});
            ASSERT_EQ(out.size(), 1u);
            ExpectNear(Values(out[0]), RefCumSum(x, s, axis < 0 ? axis + 3 : axis, exclusive, reverse), Rtol(dt),
                       "CumSum");
          }
        }
      }
    }
  }
  OneOp bad;
  Value* x = bad.In(Make(DType::kF32, {2, 3}, Vec(6, 1)));
  const std::string e = ErrorOf(bad.Add("CumSum", {x, bad.Const(Make(DType::kI64, {}, {2}))}));
  EXPECT_TRUE(Contains(e, "axis 2 is out of range for rank 2")) << e;
  OneOp late;  // an axis out of range known only at run time is refused when the kernel reads it
  Value* lx = late.In(Make(DType::kF32, {2, 3}, Vec(6, 1)));
  ASSERT_TRUE(late.Add("CumSum", {lx, late.In(Make(DType::kI64, {1}, {-3}))}).ok());
  const std::string le = ErrorOf(late.Run());
  EXPECT_TRUE(Contains(le, "axis [-3] is not one axis of rank 2")) << le;
}

// ------------------------------------------------------------------ TopK

// numpy's order: a stable sort of the indices by value, descending for largest (NaN first) or
// ascending (NaN last), so equal values keep the lower index first.
void RefTopK(const Vec& x, const Shape& s, int64_t axis, int64_t k, bool largest, Vec& values, Vec& indices) {
  Shape out = s;
  out[axis] = k;
  values.assign(static_cast<size_t>(Numel(out)), 0);
  indices.assign(values.size(), 0);
  for (int64_t i = 0; i < Numel(out); ++i) {
    std::vector<int64_t> idx = Unravel(i, out);
    const int64_t rank_in_slice = idx[axis];
    std::vector<int64_t> order(static_cast<size_t>(s[axis]));
    std::iota(order.begin(), order.end(), 0);
    auto at = [&](int64_t j) {
      idx[axis] = j;
      return x[Offset(idx, s)];
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double va = at(a), vb = at(b);
      if (std::isnan(va) || std::isnan(vb)) return largest ? std::isnan(va) && !std::isnan(vb) : !std::isnan(va) && std::isnan(vb);
      return largest ? va > vb : va < vb;
    });
    indices[i] = static_cast<double>(order[rank_in_slice]);
    values[i] = at(order[rank_in_slice]);
  }
}

TEST(ExporterOps, TopKMatchesStableSortWithTiesAndNaN) {
  Threaded th;
  const Shape s = {3, 7, 4};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    // Few distinct values: many ties.
    Vec x = Random(Numel(s), 7, -3, 3, IsFloat(dt) ? DType::kI32 : dt);
    if (IsFloat(dt)) x[5] = x[40] = x[41] = NAN;
    for (int64_t axis : {1, -1, 0}) {
      for (bool largest : {true, false}) {
        const int64_t dim = s[axis < 0 ? axis + 3 : axis];
        for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, dim}) {
          SCOPED_TRACE(StrCat("TopK ", DTypeName(dt), " axis=", axis, " largest=", largest, " k=", k));
          OneOp t;
          Value* xv = t.In(Make(dt, s, x));
          auto out = t.AddRun("TopK", {xv, t.Const(Ints({k}))}, {{"axis", axis}, {"largest", int64_t{largest}}}, 2,
                              k == dim ? th.cpu : CpuContext{});
          ASSERT_EQ(out.size(), 2u);
          EXPECT_EQ(out[1].dtype(), DType::kI64);
          Vec values, indices;
          RefTopK(x, s, axis < 0 ? axis + 3 : axis, k, largest, values, indices);
          ExpectNear(Values(out[0]), values, 0, "values");
          ExpectNear(Values(out[1]), indices, 0, "indices");
        }
      }
    }
  }
  OneOp bad;
  Value* x = bad.In(Make(DType::kF32, {2, 3}, Vec(6, 1)));
  std::string e = ErrorOf(bad.Add("TopK", {x, bad.Const(Ints({4}))}));
  EXPECT_TRUE(Contains(e, "K = 4 is out of range for axis 1 of size 3")) << e;
  e = ErrorOf(bad.Add("TopK", {x, bad.In(Ints({1}))}));
  EXPECT_TRUE(Contains(e, "needs a constant K input")) << e;
}

}  // namespace
}  // namespace graphfuse
