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
std::string ErrorOf(const Result<std::vector<Tensor>>& r) {
  return r.ok() ? std::string("<ok>") : r.status().ToString();
}
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
  {  // bool ReduceMax / ReduceMin (opset 20) are any / all; of nothing, false / true; the sums refuse bool
    for (const auto& [op, want] : std::vector<std::pair<std::string, std::vector<double>>>{
             {"ReduceMax", {1, 0, 1}}, {"ReduceMin", {0, 0, 1}}}) {
      OneOp t;
      Value* x = t.In(Make(DType::kBool, {3, 2}, {1, 0, 0, 0, 1, 1}));
      auto out = t.AddRun(op, {x}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
      ASSERT_EQ(out.size(), 1u) << op;
      EXPECT_EQ(out[0].dtype(), DType::kBool) << op;
      for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out[0].GetAsDouble(i), want[static_cast<size_t>(i)]) << op << " row " << i;
      OneOp e;
      Value* none = e.In(Tensor::Empty(DType::kBool, {2, 0}).value());
      auto empty = e.AddRun(op, {none}, {{"axes", std::vector<int64_t>{1}}});
      EXPECT_EQ(empty[0].GetAsDouble(0), op == "ReduceMin") << op;
    }
    OneOp t;
    Value* x = t.In(Make(DType::kBool, {2}, {1, 0}));
    const std::string e = ErrorOf(t.Add("ReduceSum", {x}));
    EXPECT_TRUE(Contains(e, "ReduceSum needs a numeric input, not bool")) << e;
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
      if (std::isnan(va) || std::isnan(vb))
        return largest ? std::isnan(va) && !std::isnan(vb) : !std::isnan(va) && std::isnan(vb);
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

// ------------------------------------------------------------------ GatherND / ScatterND

// Reads data at the position the output element o addresses (indices as values of an i64 tensor).
Vec RefGatherND(const Vec& data, const Shape& ds, const Vec& idx, const Shape& is, int64_t b) {
  const int64_t m = is.back();
  Shape out(is.begin(), is.end() - 1);
  out.insert(out.end(), ds.begin() + b + m, ds.end());
  Vec r;
  for (int64_t o = 0; o < Numel(out); ++o) {
    const std::vector<int64_t> oi = Unravel(o, out);
    std::vector<int64_t> di(oi.begin(), oi.begin() + b);  // the batch dims
    std::vector<int64_t> tuple_at(oi.begin(), oi.begin() + static_cast<int64_t>(is.size()) - 1);
    tuple_at.push_back(0);
    for (int64_t k = 0; k < m; ++k) {
      tuple_at.back() = k;
      const int64_t v = static_cast<int64_t>(idx[Offset(tuple_at, is)]);
      di.push_back(v < 0 ? v + ds[b + k] : v);
    }
    di.insert(di.end(), oi.begin() + static_cast<int64_t>(is.size()) - 1, oi.end());
    r.push_back(data[Offset(di, ds)]);
  }
  return r;
}

TEST(ExporterOps, GatherNDWithBatchDimsAndNegativeIndices) {
  Threaded th;
  const Shape ds = {2, 3, 4};
  struct Case {
    Shape is;
    int64_t batch_dims;
  };
  for (const Case& c : {Case{{5, 2}, 0}, Case{{2, 3, 1}, 0}, Case{{4, 3}, 0}, Case{{2, 4, 1}, 1}, Case{{2, 2, 2}, 1},
                        Case{{2, 3, 1}, 2}}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kI32, DType::kI64}) {
      SCOPED_TRACE(StrCat("GatherND ", DTypeName(dt), " indices ", ShapeToString(c.is), " batch_dims=", c.batch_dims));
      const Vec data = Random(Numel(ds), 11, -9, 9, dt);
      // Each index in [-dim, dim) of the dim it addresses.
      std::mt19937 rng(13);
      Vec idx(static_cast<size_t>(Numel(c.is)));
      for (size_t i = 0; i < idx.size(); ++i) {
        const int64_t dim = ds[c.batch_dims + static_cast<int64_t>(i) % c.is.back()];
        idx[i] = static_cast<double>(std::uniform_int_distribution<int64_t>(-dim, dim - 1)(rng));
      }
      OneOp t;
      Value* dv = t.In(Make(dt, ds, data));
      Value* iv = t.In(Make(DType::kI64, c.is, idx));
      auto out = t.AddRun("GatherND", {dv, iv}, {{"batch_dims", c.batch_dims}}, 1, th.cpu);
      ASSERT_EQ(out.size(), 1u);
      ExpectNear(Values(out[0]), RefGatherND(data, ds, idx, c.is, c.batch_dims), 0, "GatherND");
    }
  }
  OneOp t;
  Value* dv = t.In(Make(DType::kF32, ds, Vec(24, 1)));
  Value* iv = t.In(Make(DType::kI64, {2, 2}, {0, 1, 1, 3}));
  ASSERT_TRUE(t.Add("GatherND", {dv, iv}).ok());
  const std::string e = ErrorOf(t.Run());
  EXPECT_TRUE(Contains(e, "index 3 (indices position 3) is out of range for data dim 1 of size 3")) << e;
  OneOp b;
  Value* bd = b.In(Make(DType::kF32, ds, Vec(24, 1)));
  std::string be =
      ErrorOf(b.Add("GatherND", {bd, b.In(Make(DType::kI64, {3, 1}, {0, 0, 0}))}, {{"batch_dims", int64_t{1}}}));
  EXPECT_TRUE(Contains(be, "batch dim 0 of data [2,3,4] and indices [3,1] differ")) << be;
  be = ErrorOf(b.Add("GatherND", {bd, b.In(Make(DType::kI64, {2, 4}, Vec(8, 0)))}));
  EXPECT_TRUE(Contains(be, "the last dim of indices [2,4] is 4, it must be in [1, 3]")) << be;
}

// data with updates applied tuple by tuple in order, combined in double.
Vec RefScatterND(Vec data, const Shape& ds, const Vec& idx, const Shape& is, const Vec& upd, const std::string& red) {
  const int64_t m = is.back(), tuples = Numel(is) / m;
  const int64_t slice = Numel(Shape(ds.begin() + m, ds.end()));
  for (int64_t t = 0; t < tuples; ++t) {
    std::vector<int64_t> di;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t v = static_cast<int64_t>(idx[t * m + k]);
      di.push_back(v < 0 ? v + ds[k] : v);
    }
    di.resize(ds.size(), 0);
    const int64_t at = Offset(di, ds);
    for (int64_t j = 0; j < slice; ++j) {
      double& a = data[at + j];
      const double u = upd[t * slice + j];
      if (red == "none") a = u;
      else if (red == "add") a += u;
      else if (red == "mul") a *= u;
      else if (red == "max") a = std::max(a, u);
      else a = std::min(a, u);
    }
  }
  return data;
}

TEST(ExporterOps, ScatterNDEveryReductionWithRepeatedIndices) {
  const Shape ds = {4, 3, 5};
  for (const Shape& is : {Shape{6, 1}, Shape{2, 3, 2}, Shape{4, 3}}) {
    Shape us(is.begin(), is.end() - 1);
    us.insert(us.end(), ds.begin() + is.back(), ds.end());
    for (const char* red : {"none", "add", "mul", "max", "min"}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
        SCOPED_TRACE(StrCat("ScatterND ", red, " ", DTypeName(dt), " indices ", ShapeToString(is)));
        const Vec data = Random(Numel(ds), 17, -4, 4, dt), upd = Random(Numel(us), 19, -4, 4, dt);
        // Indices from a few values: repeats; a negative one too.
        std::mt19937 rng(23);
        Vec idx(static_cast<size_t>(Numel(is)));
        for (size_t i = 0; i < idx.size(); ++i) {
          const int64_t dim = ds[static_cast<int64_t>(i) % is.back()];
          const int64_t hi = std::min<int64_t>(dim - 1, 1);
          idx[i] = static_cast<double>(std::uniform_int_distribution<int64_t>(-dim, hi)(rng));
        }
        OneOp t;
        Value* dv = t.In(Make(dt, ds, data));
        Value* iv = t.In(Make(DType::kI64, is, idx));
        Value* uv = t.In(Make(dt, us, upd));
        auto out = t.AddRun("ScatterND", {dv, iv, uv}, {{"reduction", std::string(red)}});
        ASSERT_EQ(out.size(), 1u);
        // f16 / bf16 round after each combine: a few roundings where indices repeat.
        ExpectNear(Values(out[0]), RefScatterND(data, ds, idx, is, upd, red), 4 * Rtol(dt), "ScatterND");
      }
    }
  }
  OneOp t;
  Value* dv = t.In(Make(DType::kF32, {4, 2}, Vec(8, 1)));
  Value* iv = t.In(Make(DType::kI64, {2, 1}, {1, -5}));
  Value* uv = t.In(Make(DType::kF32, {2, 2}, Vec(4, 2)));
  ASSERT_TRUE(t.Add("ScatterND", {dv, iv, uv}, {{"reduction", std::string("add")}}).ok());
  std::string e = ErrorOf(t.Run());
  EXPECT_TRUE(Contains(e, "index -5 (indices position 1) is out of range for data dim 0 of size 4")) << e;
  e = ErrorOf(t.Add("ScatterND", {dv, iv, dv}));
  EXPECT_TRUE(Contains(e, "updates f32[4,2] must have the shape [2,2]")) << e;
  e = ErrorOf(t.Add("ScatterND", {dv, iv, uv}, {{"reduction", std::string("sum")}}));
  EXPECT_TRUE(Contains(e, "reduction 'sum' is not none, add, mul, max or min")) << e;
}

// ------------------------------------------------------------------ Tile

TEST(ExporterOps, TileRepeatsEveryDim) {
  Threaded th;
  const Shape s = {2, 3, 4};
  for (const std::vector<int64_t>& reps : {std::vector<int64_t>{2, 1, 3}, {1, 1, 1}, {3, 2, 1}, {1, 0, 2}}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool}) {
      SCOPED_TRACE(StrCat("Tile ", DTypeName(dt), " repeats ", ShapeToString(reps)));
      const Vec x =
          dt == DType::kBool ? Values(Make(dt, s, Random(Numel(s), 29, -1, 1))) : Random(Numel(s), 29, -9, 9, dt);
      OneOp t;
      Value* xv = t.In(Make(dt, s, x));
      auto out = t.AddRun("Tile", {xv, t.Const(Ints(reps))}, {}, 1, th.cpu);
      ASSERT_EQ(out.size(), 1u);
      Shape os = s;
      for (size_t d = 0; d < s.size(); ++d) os[d] *= reps[d];
      ASSERT_EQ(out[0].shape(), os);
      Vec want;
      for (int64_t o = 0; o < Numel(os); ++o) {
        std::vector<int64_t> idx = Unravel(o, os);
        for (size_t d = 0; d < s.size(); ++d) idx[d] %= s[d];
        want.push_back(x[Offset(idx, s)]);
      }
      ExpectNear(Values(out[0]), want, 0, "Tile");
    }
  }
  OneOp t;
  Value* x = t.In(Make(DType::kF32, {2, 3}, Vec(6, 1)));
  std::string e = ErrorOf(t.Add("Tile", {x, t.Const(Ints({2}))}));
  EXPECT_TRUE(Contains(e, "repeats [2] must have one value per dim of f32[2,3]")) << e;
  e = ErrorOf(t.Add("Tile", {x, t.Const(Ints({2, -1}))}));
  EXPECT_TRUE(Contains(e, "has a negative value")) << e;
  e = ErrorOf(t.Add("Tile", {x, t.In(Ints({2, 2}))}));
  EXPECT_TRUE(Contains(e, "needs a constant repeats input")) << e;
}

// ------------------------------------------------------------------ Pad

// numpy.pad's index for output index o of a dim of n padded by `begin` (-1: the constant),
// by reflecting / wrapping one step at a time.
int64_t RefPadIndex(int64_t o, int64_t begin, int64_t n, const std::string& mode) {
  int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  if (mode == "constant") return -1;
  if (mode == "edge") return std::clamp<int64_t>(i, 0, n - 1);
  if (mode == "wrap") {
    while (i < 0) i += n;
    while (i >= n) i -= n;
    return i;
  }
  if (n == 1) return 0;
  while (i < 0 || i >= n) {
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
  }
  return i;
}

TEST(ExporterOps, PadEveryModeWithCroppingAndAxes) {
  Threaded th;
  const Shape s = {3, 4, 5};
  struct Case {
    std::vector<int64_t> pads;
    std::vector<int64_t> axes;  // empty: every dim
  };
  for (const Case& c : {Case{{1, 0, 2, 0, 3, 1}, {}}, Case{{0, 0, 0, 0, 0, 0}, {}}, Case{{-1, 2, 0, 1, -2, 7}, {}},
                        Case{{5, 9}, {-1}}, Case{{2, 1, 0, 3}, {2, 0}}, Case{{4, 0, 0, 0, 0, 6}, {}}}) {
    for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kI32}) {
        for (bool with_value : {false, true}) {
          SCOPED_TRACE(StrCat("Pad ", mode, " ", DTypeName(dt), " pads ", ShapeToString(c.pads), " axes ",
                              ShapeToString(c.axes), " value=", with_value));
          const Vec x = Random(Numel(s), 31, -9, 9, dt);
          OneOp t;
          std::vector<Value*> ins = {t.In(Make(dt, s, x)), t.Const(Ints(c.pads))};
          const double value = dt == DType::kI32 ? 7 : 2.5;
          ins.push_back(with_value ? t.Const(Make(dt, {}, {value})) : nullptr);
          if (!c.axes.empty()) ins.push_back(t.Const(Ints(c.axes)));
          auto out = t.AddRun("Pad", ins, {{"mode", std::string(mode)}}, 1, th.cpu);
          ASSERT_EQ(out.size(), 1u);
          // Per dim of x: the count padded before it and the output size.
          std::vector<int64_t> axes = c.axes;
          if (axes.empty()) axes = {0, 1, 2};
          std::vector<int64_t> begin(3, 0);
          Shape os = s;
          for (size_t k = 0; k < axes.size(); ++k) {
            const int64_t a = axes[k] < 0 ? axes[k] + 3 : axes[k];
            begin[a] = c.pads[k];
            os[a] += c.pads[k] + c.pads[k + axes.size()];
          }
          ASSERT_EQ(out[0].shape(), os);
          Vec want;
          for (int64_t o = 0; o < Numel(os); ++o) {
            std::vector<int64_t> idx = Unravel(o, os);
            bool fill = false;
            for (size_t d = 0; d < 3; ++d) {
              idx[d] = RefPadIndex(idx[d], begin[d], s[d], mode);
              fill |= idx[d] < 0;
            }
            want.push_back(fill ? (with_value ? value : 0) : x[Offset(idx, s)]);
          }
          ExpectNear(Values(out[0]), want, 0, "Pad");
        }
      }
    }
  }
  OneOp t;
  Value* x = t.In(Make(DType::kF32, {2, 3}, Vec(6, 1)));
  std::string e = ErrorOf(t.Add("Pad", {x, t.Const(Ints({1, 1}))}));
  EXPECT_TRUE(Contains(e, "pads [1,1] must hold 2 values per padded axis (2 axes of [2,3])")) << e;
  e = ErrorOf(t.Add("Pad", {x, t.Const(Ints({0, -2, 0, -2}))}));
  EXPECT_TRUE(Contains(e, "give axis 1 of size 3 a size below 0")) << e;
  e = ErrorOf(t.Add("Pad", {x, t.Const(Ints({0, 0, 0, 0}))}, {{"mode", std::string("mirror")}}));
  EXPECT_TRUE(Contains(e, "mode 'mirror' is not constant, reflect, edge or wrap")) << e;
  e = ErrorOf(t.Add("Pad", {x, t.In(Ints({0, 0, 0, 0}))}));
  EXPECT_TRUE(Contains(e, "needs a constant pads input")) << e;
  OneOp empty;
  Value* ex = empty.In(Tensor::Empty(DType::kF32, {2, 0}).value());
  e = ErrorOf(empty.Add("Pad", {ex, empty.Const(Ints({0, 1, 0, 1}))}, {{"mode", std::string("reflect")}}));
  EXPECT_TRUE(Contains(e, "axis 1 is empty: 'reflect' padding has nothing to repeat")) << e;
}

}  // namespace
}  // namespace graphfuse
