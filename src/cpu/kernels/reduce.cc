// The reductions of ONNX (opsets 13-18): ReduceSum, ReduceMean, ReduceMax, ReduceMin,
// ReduceProd, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp; ArgMax /
// ArgMin, CumSum and TopK along one axis.
//
// Axes come from the `axes` attribute (up to opset 17; ReduceSum up to 12) or from an optional
// constant second input (ReduceSum from 13, all of them from 18); either form is accepted for
// every op. Empty axes reduce everything unless noop_with_empty_axes=1 (then Y = X); keepdims
// defaults to 1; negative axes count from the end.
//
// Algorithm: the input dims are coalesced into alternating kept/reduced groups (size-1 dims
// dropped). If the innermost group is kept, each output row accumulates `vec` contiguous lanes
// per reduced position (column reductions stay cache friendly); otherwise the innermost reduced
// group is a contiguous run summed per output element. Float types accumulate in double, ints
// in int64; ReduceMax / ReduceMin propagate NaN like numpy and take bool (any / all, opset 20).
// ReduceL2, ReduceLogSum and ReduceLogSumExp run on floats only.
//
// Along one axis besides ArgMax / ArgMin: CumSum (running sums; exclusive, reverse) and TopK
// (the k largest or smallest with their indices).
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/reduce.cc.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ir/schemas/reduce.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"

namespace graphfuse::kernels {
namespace {

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL1, kL2, kLogSum, kLogSumExp };

// Kinds whose result is a float function of the data (a root or a log): not run on integers.
constexpr bool FloatOnly(ReduceKind k) {
  return k == ReduceKind::kL2 || k == ReduceKind::kLogSum || k == ReduceKind::kLogSumExp;
}

using schemas::MakeAxes;
using schemas::ReduceAxes;

// Storage and accumulation per dtype.
template <DType D>
struct Traits;
template <>
struct Traits<DType::kF32> {
  using T = float;
  using Acc = double;
  static Acc Load(T v) { return v; }
  static T Store(Acc a) { return static_cast<float>(a); }
};
template <>
struct Traits<DType::kF16> {
  using T = uint16_t;
  using Acc = double;
  static Acc Load(T v) { return F16BitsToF32(v); }
  static T Store(Acc a) { return F32ToF16Bits(static_cast<float>(a)); }
};
template <>
struct Traits<DType::kBF16> {
  using T = uint16_t;
  using Acc = double;
  static Acc Load(T v) { return BF16BitsToF32(v); }
  static T Store(Acc a) { return F32ToBF16Bits(static_cast<float>(a)); }
};
template <>
struct Traits<DType::kI32> {
  using T = int32_t;
  using Acc = int64_t;
  static Acc Load(T v) { return v; }
  static T Store(Acc a) { return static_cast<int32_t>(a); }
};
// bool (ReduceMax / ReduceMin only): any / all, accumulated as 0 / 1.
template <>
struct Traits<DType::kBool> {
  using T = uint8_t;
  using Acc = int64_t;
  static Acc Load(T v) { return v != 0; }
  static T Store(Acc a) { return a != 0; }
};
template <>
struct Traits<DType::kI64> {
  using T = int64_t;
  using Acc = int64_t;
  static Acc Load(T v) { return v; }
  static T Store(Acc a) { return a; }
};

// ReduceLogSumExp's running state: the largest element so far and the sum of exp(x - max), so
// that no exp overflows (log-sum-exp of [1000, 1000] is 1000 + log 2, not inf).
struct LogSumExpState {
  double max = -INFINITY;
  double sum = 0;
};

// What each kind does: the state before any element (Init), one element joining it (Step), two
// partial states joining (Merge), and the result from the state and the element count (Finish).
// Floats accumulate in double, integers in int64 (products wrap, as numpy's); Max / Min
// propagate NaN like numpy. Over no elements: 0 for sums, 1 for products, the type's lowest /
// largest for Max / Min (-inf / inf for floats), log(0) = -inf for the logs.
template <ReduceKind K, class Tr>
struct Reducer {
  using Acc = typename Tr::Acc;
  using State = std::conditional_t<K == ReduceKind::kLogSumExp, LogSumExpState, Acc>;
  static constexpr bool kFloat = std::is_floating_point_v<Acc>;

  static State Init() {
    if constexpr (K == ReduceKind::kMax)
      return kFloat ? -std::numeric_limits<Acc>::infinity() : Acc(std::numeric_limits<typename Tr::T>::lowest());
    else if constexpr (K == ReduceKind::kMin)
      return kFloat ? std::numeric_limits<Acc>::infinity() : Acc(std::numeric_limits<typename Tr::T>::max());
    else if constexpr (K == ReduceKind::kProd) return Acc(1);
    else return State{};
  }
  static State Step(State a, Acc v) {
    if constexpr (K == ReduceKind::kMax) return (v > a || v != v) && !(a != a) ? v : a;
    else if constexpr (K == ReduceKind::kMin) return (v < a || v != v) && !(a != a) ? v : a;
    else if constexpr (K == ReduceKind::kProd) return Multiply(a, v);
    else if constexpr (K == ReduceKind::kSumSquare || K == ReduceKind::kL2) return a + Multiply(v, v);
    else if constexpr (K == ReduceKind::kL1) return a + (v < 0 ? Multiply(v, Acc(-1)) : v);
    else if constexpr (K == ReduceKind::kLogSumExp) return Merge(a, LogSumExpState{v, 1});
    else return a + v;
  }
  static State Merge(State a, State b) {
    if constexpr (K == ReduceKind::kMax || K == ReduceKind::kMin) return Step(a, b);
    else if constexpr (K == ReduceKind::kProd) return Multiply(a, b);
    else if constexpr (K == ReduceKind::kLogSumExp) {
      if (a.max != a.max || b.max != b.max) return {NAN, NAN};
      if (b.max > a.max) std::swap(a, b);
      if (b.max == -INFINITY) return a;  // b holds nothing (or only -inf, which adds 0)
      if (a.max == INFINITY) return {INFINITY, 1};
      return {a.max, a.sum + b.sum * std::exp(b.max - a.max)};
    } else {
      return a + b;
    }
  }
  static Acc Finish(State a, int64_t count) {
    if constexpr (K == ReduceKind::kMean) {
      if constexpr (kFloat) return a / static_cast<Acc>(count);
      else return count ? a / count : 0;
    } else if constexpr (K == ReduceKind::kL2) {
      return std::sqrt(a);
    } else if constexpr (K == ReduceKind::kLogSum) {
      return std::log(a);
    } else if constexpr (K == ReduceKind::kLogSumExp) {
      return a.max == -INFINITY || a.max == INFINITY || a.max != a.max ? a.max : a.max + std::log(a.sum);
    } else {
      return a;
    }
  }

 private:
  // Integer products wrap (two's complement) instead of overflowing into undefined behaviour.
  static Acc Multiply(Acc a, Acc b) {
    if constexpr (kFloat) return a * b;
    else return static_cast<Acc>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  }
};

// The iteration space after coalescing (see the note at the top).
struct Plan {
  std::vector<int64_t> kept_sizes, kept_strides, red_sizes, red_strides;
  int64_t vec = 1, inner_red = 1, rows = 1, count = 1;
};

Plan MakePlan(const Shape& in, const std::vector<bool>& reduced) {
  std::vector<int64_t> sizes;
  std::vector<bool> flags;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == 1) continue;
    if (!flags.empty() && flags.back() == reduced[i]) sizes.back() *= in[i];
    else sizes.push_back(in[i]), flags.push_back(reduced[i]);
  }
  Plan p;
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) strides[i - 1] = strides[i] * sizes[i];
  if (!sizes.empty()) {
    if (flags.back()) p.inner_red = sizes.back();
    else p.vec = sizes.back();
    sizes.pop_back(), flags.pop_back(), strides.pop_back();
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto& s = flags[i] ? p.red_sizes : p.kept_sizes;
    auto& t = flags[i] ? p.red_strides : p.kept_strides;
    s.push_back(sizes[i]), t.push_back(strides[i]);
  }
  for (int64_t s : p.kept_sizes) p.rows *= s;
  p.count = p.inner_red;
  for (int64_t s : p.red_sizes) p.count *= s;
  return p;
}

template <DType D, ReduceKind K>
void RunReduce(const KernelContext& ctx, const Plan& p) {
  using Tr = Traits<D>;
  using R = Reducer<K, Tr>;
  using T = typename Tr::T;
  using State = typename R::State;
  const T* in = ctx.inputs[0].as<const T>();
  T* out = ctx.outputs[0].as<T>();
  int64_t red_total = 1;
  for (int64_t s : p.red_sizes) red_total *= s;
  ParallelFor(ctx.cpu, p.rows, p.count * p.vec, [&](int64_t begin, int64_t end) {
    std::vector<State> acc(static_cast<size_t>(p.vec));
    std::vector<int64_t> ridx(p.red_sizes.size());
    for (int64_t row = begin; row < end; ++row) {
      int64_t base = 0, rem = row;
      for (size_t k = p.kept_sizes.size(); k-- > 0;) base += (rem % p.kept_sizes[k]) * p.kept_strides[k], rem /= p.kept_sizes[k];
      std::fill(acc.begin(), acc.end(), R::Init());
      std::fill(ridx.begin(), ridx.end(), 0);
      int64_t roff = 0;
      for (int64_t r = 0; r < red_total; ++r) {
        const T* src = in + base + roff;
        if (p.vec > 1) {
          for (int64_t v = 0; v < p.vec; ++v) acc[v] = R::Step(acc[v], Tr::Load(src[v]));
        } else {
          // Eight independent partial results: one running accumulator is latency bound.
          State part[8];
          for (State& a : part) a = R::Init();
          int64_t t = 0;
          for (; t + 8 <= p.inner_red; t += 8)
            for (int l = 0; l < 8; ++l) part[l] = R::Step(part[l], Tr::Load(src[t + l]));
          for (int l = 0; t < p.inner_red; ++t, ++l) part[l] = R::Step(part[l], Tr::Load(src[t]));
          State a = acc[0];
          for (const State& v : part) a = R::Merge(a, v);
          acc[0] = a;
        }
        for (size_t k = ridx.size(); k-- > 0;) {  // odometer over the reduced groups
          roff += p.red_strides[k];
          if (++ridx[k] < p.red_sizes[k]) break;
          roff -= ridx[k] * p.red_strides[k];
          ridx[k] = 0;
        }
      }
      for (int64_t v = 0; v < p.vec; ++v) out[row * p.vec + v] = Tr::Store(R::Finish(acc[v], p.count));
    }
  });
}

// Fills every output element with the reduction of nothing (a reduced dim of size 0).
template <DType D, ReduceKind K>
void FillEmpty(const KernelContext& ctx) {
  using Tr = Traits<D>;
  using R = Reducer<K, Tr>;
  typename Tr::T* out = ctx.outputs[0].as<typename Tr::T>();
  const auto v = Tr::Store(R::Finish(R::Init(), 0));
  for (int64_t i = 0, n = ctx.outputs[0].numel(); i < n; ++i) out[i] = v;
}

template <ReduceKind K>
Status ReduceKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  std::vector<int64_t> axes = HasInput(ctx, 1) ? ReadInts(ctx.inputs[1]) : ctx.node.GetInts("axes");
  for (int64_t a : axes)
    if (a < -rank || a >= rank) return InvalidArgument(KernelWhere(ctx), ": axis ", a, " out of range");
  const ReduceAxes ax = MakeAxes(axes, rank, ctx.node.GetInt("noop_with_empty_axes", 0) != 0);
  if (ax.noop) {
    if (ctx.outputs[0].data != X.data)
      std::memcpy(ctx.outputs[0].data, X.data, static_cast<size_t>(X.numel()) * DTypeSize(X.dtype));
    return Status::Ok();
  }
  const bool empty = X.numel() == 0;
  const Plan p = empty ? Plan{} : MakePlan(X.shape, ax.reduced);
#define GF_REDUCE_CASE(d)                  \
  case d:                                  \
    if (empty) FillEmpty<d, K>(ctx);       \
    else RunReduce<d, K>(ctx, p);          \
    return Status::Ok();
  switch (X.dtype) {
    GF_REDUCE_CASE(DType::kF32)
    GF_REDUCE_CASE(DType::kF16)
    GF_REDUCE_CASE(DType::kBF16)
    default: break;
  }
  if constexpr (!FloatOnly(K)) {
    switch (X.dtype) {
      GF_REDUCE_CASE(DType::kI32)
      GF_REDUCE_CASE(DType::kI64)
      default: break;
    }
  }
  if constexpr (K == ReduceKind::kMax || K == ReduceKind::kMin) {
    switch (X.dtype) {
      GF_REDUCE_CASE(DType::kBool)
      default: break;
    }
  }
#undef GF_REDUCE_CASE
  return Unimplemented(KernelWhere(ctx), ": no reduction kernel for ", DTypeName(X.dtype));
}

// ArgMax / ArgMin along one axis: the first index of the extreme value (the last with
// select_last_index = 1); a NaN is the extreme, as numpy's argmax / argmin take it.
template <bool kMax>
Status ArgReduceKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", 0, rank));
  const bool last = ctx.node.GetInt("select_last_index", 0) != 0;
  const int64_t dim = X.shape[axis];
  const int64_t outer = schemas::Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = schemas::Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size());
  int64_t* out = ctx.outputs[0].as<int64_t>();
  ParallelFor(ctx.cpu, outer * inner, dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / inner, i = t % inner;
      int64_t best_at = 0;
      double best = LoadAsDouble(X, o * dim * inner + i);
      for (int64_t j = 1; j < dim && !std::isnan(best); ++j) {
        const double v = LoadAsDouble(X, (o * dim + j) * inner + i);
        const bool better = std::isnan(v) || (kMax ? (last ? v >= best : v > best) : (last ? v <= best : v < best));
        if (better) best = v, best_at = j;
      }
      out[t] = best_at;
    }
  });
  return Status::Ok();
}

// ---- CumSum ----

// Running sums along the axis, in double for floats (each output rounded once) and in wrapping
// int64 for integers. The inner dims go in blocks of kBlock lanes, each block walking the axis
// once with one accumulator per lane.
template <DType D>
void RunCumSum(const KernelContext& ctx, int64_t axis, bool exclusive, bool reverse) {
  using Tr = Traits<D>;
  using T = typename Tr::T;
  using Acc = typename Tr::Acc;
  constexpr int64_t kBlock = 256;
  const TensorView& X = ctx.inputs[0];
  const T* in = X.as<const T>();
  T* out = ctx.outputs[0].as<T>();
  const int64_t dim = X.shape[axis];
  const int64_t outer = Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size());
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  ParallelFor(ctx.cpu, outer * blocks, dim * std::min(inner, kBlock), [&](int64_t begin, int64_t end) {
    Acc acc[kBlock];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / blocks, i0 = (t % blocks) * kBlock, n = std::min(kBlock, inner - i0);
      std::fill(acc, acc + n, Acc(0));
      for (int64_t s = 0; s < dim; ++s) {
        const int64_t at = (o * dim + (reverse ? dim - 1 - s : s)) * inner + i0;
        for (int64_t l = 0; l < n; ++l) {
          const Acc v = Tr::Load(in[at + l]);
          const Acc before = acc[l];
          if constexpr (std::is_floating_point_v<Acc>) acc[l] += v;
          else acc[l] = static_cast<Acc>(static_cast<uint64_t>(acc[l]) + static_cast<uint64_t>(v));
          out[at + l] = Tr::Store(exclusive ? before : acc[l]);
        }
      }
    }
  });
}

Status CumSumKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  const std::vector<int64_t> axis_in = ReadInts(ctx.inputs[1]);
  if (axis_in.size() != 1 || axis_in[0] < -rank || axis_in[0] >= rank)
    return InvalidArgument(KernelWhere(ctx), ": axis ", ShapeToString(axis_in), " is not one axis of rank ", rank);
  const int64_t axis = axis_in[0] < 0 ? axis_in[0] + rank : axis_in[0];
  const bool exclusive = ctx.node.GetInt("exclusive", 0) != 0, reverse = ctx.node.GetInt("reverse", 0) != 0;
  switch (X.dtype) {
    case DType::kF32: RunCumSum<DType::kF32>(ctx, axis, exclusive, reverse); break;
    case DType::kF16: RunCumSum<DType::kF16>(ctx, axis, exclusive, reverse); break;
    case DType::kBF16: RunCumSum<DType::kBF16>(ctx, axis, exclusive, reverse); break;
    case DType::kI32: RunCumSum<DType::kI32>(ctx, axis, exclusive, reverse); break;
    case DType::kI64: RunCumSum<DType::kI64>(ctx, axis, exclusive, reverse); break;
    default: return Unimplemented(KernelWhere(ctx), ": no CumSum kernel for ", DTypeName(X.dtype));
  }
  return Status::Ok();
}

// ---- TopK ----

// The k largest (smallest) elements of each slice along the axis, in that order, with their
// indices; of equal elements the lower index comes first, and a NaN counts as larger than any
// number (first among the largest, never among the smallest while numbers remain). Floats
// compare as double (exact for every float storage type), integers as int64. The values are
// copied from the input, bit for bit.
template <class Key>
void RunTopK(const KernelContext& ctx, int64_t axis, int64_t k, bool largest) {
  const TensorView& X = ctx.inputs[0];
  const int64_t dim = X.shape[axis];
  const int64_t outer = Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size());
  const size_t esize = DTypeSize(X.dtype);
  const char* in = static_cast<const char*>(X.data);
  char* values = static_cast<char*>(ctx.outputs[0].data);
  int64_t* indices = ctx.outputs[1].as<int64_t>();
  auto key = [&](int64_t i) -> Key {
    if constexpr (std::is_floating_point_v<Key>) return LoadAsDouble(X, i);
    else return X.dtype == DType::kI32 ? X.as<const int32_t>()[i] : X.as<const int64_t>()[i];
  };
  // a above b in the order of "larger": NaN above every number.
  auto above = [](Key a, Key b) {
    if constexpr (std::is_floating_point_v<Key>)
      if (a != a || b != b) return a != a && b == b;
    return a > b;
  };
  ParallelFor(ctx.cpu, outer * inner, dim + 1, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<Key, int64_t>> slice(static_cast<size_t>(dim));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / inner, i = t % inner;
      for (int64_t j = 0; j < dim; ++j) slice[j] = {key((o * dim + j) * inner + i), j};
      auto first = [&](const std::pair<Key, int64_t>& a, const std::pair<Key, int64_t>& b) {
        const bool a_wins = largest ? above(a.first, b.first) : above(b.first, a.first);
        const bool b_wins = largest ? above(b.first, a.first) : above(a.first, b.first);
        return a_wins || (!b_wins && a.second < b.second);
      };
      std::partial_sort(slice.begin(), slice.begin() + k, slice.end(), first);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t dst = (o * k + j) * inner + i;
        std::memcpy(values + dst * esize, in + ((o * dim + slice[j].second) * inner + i) * esize, esize);
        indices[dst] = slice[j].second;
      }
    }
  });
}

Status TopKKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", -1, rank));
  const std::vector<int64_t> k = ReadInts(ctx.inputs[1]);
  if (k.size() != 1 || k[0] < 0 || k[0] > X.shape[axis] || ctx.outputs[0].shape[axis] != k[0])
    return InvalidArgument(KernelWhere(ctx), ": K ", ShapeToString(k), " does not fit axis ", axis, " of size ",
                           X.shape[axis], " and the output ", TypeStr(ctx.outputs[0]));
  const bool largest = ctx.node.GetInt("largest", 1) != 0;
  if (IsFloat(X.dtype)) RunTopK<double>(ctx, axis, k[0], largest);
  else if (X.dtype == DType::kI32 || X.dtype == DType::kI64) RunTopK<int64_t>(ctx, axis, k[0], largest);
  else return Unimplemented(KernelWhere(ctx), ": no TopK kernel for ", DTypeName(X.dtype));
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> ReduceKernels() {
  return {
      {"ReduceSum", ReduceKernel<ReduceKind::kSum>},
      {"ReduceMean", ReduceKernel<ReduceKind::kMean>},
      {"ReduceMax", ReduceKernel<ReduceKind::kMax>},
      {"ReduceMin", ReduceKernel<ReduceKind::kMin>},
      {"ReduceProd", ReduceKernel<ReduceKind::kProd>},
      {"ReduceSumSquare", ReduceKernel<ReduceKind::kSumSquare>},
      {"ReduceL1", ReduceKernel<ReduceKind::kL1>},
      {"ReduceL2", ReduceKernel<ReduceKind::kL2>},
      {"ReduceLogSum", ReduceKernel<ReduceKind::kLogSum>},
      {"ReduceLogSumExp", ReduceKernel<ReduceKind::kLogSumExp>},
      {"ArgMax", ArgReduceKernel<true>},
      {"ArgMin", ArgReduceKernel<false>},
      {"CumSum", CumSumKernel},
      {"TopK", TopKKernel},
  };
}

}  // namespace graphfuse::kernels
