// The reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare,
// ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp; ONNX opsets 13-18), and ArgMax / ArgMin:
// inference. The CPU kernels are in src/cpu/kernels/reduce.cc.
//
// Axes come from the `axes` attribute (up to opset 17; ReduceSum up to 12) or from an optional
// constant second input (ReduceSum from 13, all of them from 18); either form is accepted for
// every op. Empty axes reduce everything unless noop_with_empty_axes=1 (then Y = X);
// keepdims defaults to 1; negative axes count from the end. ReduceL2, ReduceLogSum and
// ReduceLogSumExp (a root or a log of the data) take floats only.
// Along one axis besides ArgMax / ArgMin: CumSum and TopK.
#include "ir/schemas/reduce.h"

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

ReduceAxes MakeAxes(std::vector<int64_t> axes, int64_t rank, bool noop_with_empty) {
  ReduceAxes r;
  r.reduced.assign(static_cast<size_t>(rank), axes.empty());
  r.noop = axes.empty() && noop_with_empty;
  if (r.noop) r.reduced.assign(static_cast<size_t>(rank), false);
  for (int64_t a : axes) r.reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  return r;
}

namespace {

Shape ReducedShape(const Shape& in, const ReduceAxes& ax, bool keepdims) {
  if (ax.noop) return in;
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!ax.reduced[i]) out.push_back(in[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

Result<std::vector<ValueType>> InferReduce(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  // ReduceMax / ReduceMin take bool from opset 20 (any / all); the others count or add.
  const op::Id id = op::FromName(ctx.op);
  if (x->dtype() == DType::kBool && id != op::ReduceMax && id != op::ReduceMin)
    return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs a numeric input, not bool");
  if (!IsFloat(x->dtype()) && (id == op::ReduceL2 || id == op::ReduceLogSum || id == op::ReduceLogSumExp))
    return Unimplemented(ctx.Describe(), ": ", ctx.op, " on ", DTypeName(x->dtype()),
                         " is not supported (floats only)");
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  std::vector<int64_t> axes;
  if (ctx.input(1) != nullptr) {
    if (ctx.HasAttr("axes"))
      return InvalidArgument(ctx.Describe(), ": axes given both as an attribute and as an input");
    GF_ASSIGN_OR_RETURN(axes, RequireConstInts(ctx, 1, "axes"));
  } else {
    axes = ctx.GetInts("axes");
  }
  GF_RETURN_IF_ERROR(NormalizeAxes(ctx, axes, rank).status());
  const ReduceAxes ax = MakeAxes(axes, rank, ctx.GetInt("noop_with_empty_axes", 0) != 0);
  return std::vector<ValueType>{{x->dtype(), ReducedShape(x->shape(), ax, ctx.GetInt("keepdims", 1) != 0)}};
}

// ArgMax / ArgMin: the index (i64) of the largest / smallest element along one axis (default
// 0), kept as a dim of 1 unless keepdims = 0.
Result<std::vector<ValueType>> InferArgReduce(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  if (x->dtype() == DType::kBool) return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs a numeric input, not bool");
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs an input of rank >= 1");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank));
  if (x->shape()[axis] == 0)
    return InvalidArgument(ctx.Describe(), ": axis ", axis, " of ", x->TypeString(), " is empty: no element to pick");
  Shape out;
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis) out.push_back(x->shape()[d]);
    else if (ctx.GetInt("keepdims", 1) != 0) out.push_back(1);
  return std::vector<ValueType>{{DType::kI64, out}};
}

// CumSum: running sums along the axis given by input 1 (one i32 / i64 value; the output's shape
// does not depend on it, so it may be computed at run time); exclusive, reverse.
Result<std::vector<ValueType>> InferCumSum(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* axis = ctx.input(1);
  if (x->dtype() == DType::kBool) return InvalidArgument(ctx.Describe(), ": CumSum needs a numeric input, not bool");
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": CumSum needs an input of rank >= 1");
  if (!IsIndexType(axis->dtype()) || axis->numel() != 1 || axis->shape().size() > 1)
    return InvalidArgument(ctx.Describe(), ": the axis input must be one i32 or i64 value, got ", axis->TypeString());
  if (ctx.ConstInput(1) != nullptr) {
    GF_ASSIGN_OR_RETURN(auto a, ctx.ConstInts(1, "axis"));
    GF_RETURN_IF_ERROR(NormalizeAxis(ctx, a[0], rank).status());
  }
  return std::vector<ValueType>{{x->dtype(), x->shape()}};
}

// TopK: the K largest (largest = 1, the default) or smallest elements along `axis` (default
// -1), and their indices (i64). K is input 1, one constant value in [0, the axis' size].
Result<std::vector<ValueType>> InferTopK(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  if (x->dtype() == DType::kBool) return InvalidArgument(ctx.Describe(), ": TopK needs a numeric input, not bool");
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": TopK needs an input of rank >= 1");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", -1), rank));
  GF_ASSIGN_OR_RETURN(auto k, RequireConstInts(ctx, 1, "K"));
  if (k.size() != 1) return InvalidArgument(ctx.Describe(), ": K must be one value, got ", ShapeToString(k));
  if (k[0] < 0 || k[0] > x->shape()[axis])
    return InvalidArgument(ctx.Describe(), ": K = ", k[0], " is out of range for axis ", axis, " of size ",
                           x->shape()[axis]);
  Shape out = x->shape();
  out[axis] = k[0];
  return std::vector<ValueType>{{x->dtype(), out}, {DType::kI64, out}};
}

}  // namespace

std::vector<OpSchema> ReduceSchemas() {
  return {
      {"ReduceSum", 1, 2, 1, InferReduce},
      {"ReduceMean", 1, 2, 1, InferReduce},
      {"ReduceMax", 1, 2, 1, InferReduce},
      {"ReduceMin", 1, 2, 1, InferReduce},
      {"ReduceProd", 1, 2, 1, InferReduce},
      {"ReduceSumSquare", 1, 2, 1, InferReduce},
      {"ReduceL1", 1, 2, 1, InferReduce},
      {"ReduceL2", 1, 2, 1, InferReduce},
      {"ReduceLogSum", 1, 2, 1, InferReduce},
      {"ReduceLogSumExp", 1, 2, 1, InferReduce},
      {"ArgMax", 1, 1, 1, InferArgReduce},
      {"ArgMin", 1, 1, 1, InferArgReduce},
      {"CumSum", 2, 2, 1, InferCumSum},
      {"TopK", 2, 2, 2, InferTopK},
  };
}

}  // namespace graphfuse::schemas
