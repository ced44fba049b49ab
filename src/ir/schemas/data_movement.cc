// Data movement, dtype-generic: inference. The CPU kernels are in
// src/cpu/kernels/data_movement.cc.
//   Transpose (perm, default reversed), Concat (axis), Split (split input, num_outputs, or the
//   output shapes), Slice (starts/ends/axes/steps inputs, ONNX clamping, negative steps),
//   Gather (axis, negative indices), GatherElements (indices of data's rank, along axis),
//   Trilu (upper / lower triangle from diagonal k), Expand (bidirectional broadcast to a constant
//   shape).
#include "data_movement.h"

#include <climits>

#include "infer_util.h"
#include "schema_lists.h"

namespace graphfuse::schemas {

Result<std::vector<int64_t>> TransposePerm(const std::vector<int64_t>& given, bool has, size_t rank,
                                           const std::string& where) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(rank - 1 - i);
  if (!has) return perm;
  std::vector<bool> seen(rank, false);
  bool ok = given.size() == rank;
  for (size_t i = 0; ok && i < rank; ++i) {
    ok = given[i] >= 0 && given[i] < static_cast<int64_t>(rank) && !seen[given[i]];
    if (ok) seen[given[i]] = true;
  }
  if (!ok) return InvalidArgument(where, ": perm ", ShapeToString(given), " is not a permutation of 0..", rank - 1);
  return given;
}

Result<SliceParams> ComputeSlice(const Shape& shape, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps, bool has_axes, bool has_steps, const std::string& where) {
  const size_t n = starts.size();
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (!has_axes) {
    axes.resize(n);
    for (size_t i = 0; i < n; ++i) axes[i] = static_cast<int64_t>(i);
  }
  if (!has_steps) steps.assign(n, 1);
  if (ends.size() != n || axes.size() != n || steps.size() != n)
    return InvalidArgument(where, ": starts, ends, axes and steps must have one length; got ", n, ", ", ends.size(),
                           ", ", axes.size(), ", ", steps.size());
  SliceParams p{std::vector<int64_t>(shape.size(), 0), std::vector<int64_t>(shape.size(), 1), shape};
  std::vector<bool> seen(shape.size(), false);
  for (size_t i = 0; i < n; ++i) {
    int64_t a = axes[i];
    if (a < -rank || a >= rank) return InvalidArgument(where, ": axis ", a, " is out of range for rank ", rank);
    if (a < 0) a += rank;
    if (seen[a]) return InvalidArgument(where, ": axes ", ShapeToString(axes), " repeat axis ", axes[i]);
    seen[a] = true;
    const int64_t st = steps[i], dim = shape[a];
    if (st == 0) return InvalidArgument(where, ": steps must not be 0 (axis ", axes[i], ")");
    int64_t s = starts[i], e = ends[i], len = 0;
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim), e = std::clamp<int64_t>(e, 0, dim);
      len = e > s ? (e - s - 1) / st + 1 : 0;
    } else if (dim > 0) {
      s = std::clamp<int64_t>(s, 0, dim - 1), e = std::clamp<int64_t>(e, -1, dim - 1);
      const uint64_t ast = 0 - static_cast<uint64_t>(st);
      len = s > e ? static_cast<int64_t>(static_cast<uint64_t>(s - e - 1) / ast) + 1 : 0;
    } else {
      s = 0;
    }
    p.start[a] = s, p.step[a] = st, p.out[a] = len;
  }
  return p;
}

namespace {

// ---- Transpose ----

Result<std::vector<ValueType>> InferTranspose(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto perm, TransposePerm(ctx.GetInts("perm"), ctx.HasAttr("perm"), x->shape().size(), ctx.Describe()));
  Shape out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[i] = x->shape()[perm[i]];
  return std::vector<ValueType>{{x->dtype(), out}};
}

// ---- Concat ----

Result<std::vector<ValueType>> InferConcat(const InferContext& ctx) {
  if (!ctx.HasAttr("axis")) return InvalidArgument(ctx.Describe(), ": Concat needs an 'axis' attribute");
  const Value* first = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(first->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": Concat cannot join scalars (rank 0)");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank));
  Shape out = first->shape();
  out[axis] = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Value* v = ctx.input(i);
    if (v == nullptr) return InvalidArgument(ctx.Describe(), ": input ", i, " is missing");
    if (v->dtype() != first->dtype())
      return InvalidArgument(ctx.Describe(), ": all inputs must have one dtype; input ", i, " is ", DTypeName(v->dtype()));
    bool ok = static_cast<int64_t>(v->shape().size()) == rank;
    for (int64_t k = 0; ok && k < rank; ++k) ok = k == axis || v->shape()[k] == first->shape()[k];
    if (!ok)
      return InvalidArgument(ctx.Describe(), ": input ", i, " ", ShapeToString(v->shape()),
                             " differs from input 0 ", ShapeToString(first->shape()), " outside axis ", axis);
    out[axis] += v->shape()[axis];
  }
  return std::vector<ValueType>{{first->dtype(), out}};
}

// ---- Split ----

Result<std::vector<ValueType>> InferSplit(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": Split needs an input of rank >= 1");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank));
  const int64_t dim = x->shape()[axis];
  std::vector<int64_t> sizes = ctx.GetInts("split");  // opset 11 form
  if (ctx.input(1) != nullptr || ctx.HasAttr("split")) {
    if (ctx.input(1) != nullptr) {
      GF_ASSIGN_OR_RETURN(sizes, RequireConstInts(ctx, 1, "split"));
    }
    int64_t sum = 0;
    for (int64_t s : sizes) {
      if (s < 0) return InvalidArgument(ctx.Describe(), ": split ", ShapeToString(sizes), " has a negative size");
      if (__builtin_add_overflow(sum, s, &sum))
        return InvalidArgument(ctx.Describe(), ": split ", ShapeToString(sizes), " overflows int64");
    }
    if (sum != dim)
      return InvalidArgument(ctx.Describe(), ": split ", ShapeToString(sizes), " sums to ", sum, " but axis ", axis,
                             " has ", dim);
  } else if (ctx.HasAttr("num_outputs")) {
    // Opset 18: equal parts of ceil(dim / n), the last one smaller.
    const int64_t n = ctx.GetInt("num_outputs", 0);
    // n <= max(dim, 1) also bounds the sizes vector by the (already allocated) dim.
    if (n < 1 || n > std::max<int64_t>(dim, 1))
      return InvalidArgument(ctx.Describe(), ": num_outputs ", n, " is invalid for axis ", axis, " of size ", dim);
    const int64_t part = dim / n + (dim % n != 0 ? 1 : 0);  // ceil without overflowing dim + n
    for (int64_t i = 0, left = dim; i < n; ++i, left -= part) sizes.push_back(std::max<int64_t>(std::min(part, left), 0));
    if (sizes.back() == 0 && dim > 0)
      return InvalidArgument(ctx.Describe(), ": axis ", axis, " of size ", dim, " cannot be split into ", n, " parts");
  } else {
    // Opset 13 splits equally into as many outputs as the node has, which inference cannot see:
    // the builder / importer states it as the num_outputs attribute.
    return InvalidArgument(ctx.Describe(), ": Split without a 'split' input needs a 'num_outputs' attribute");
  }
  std::vector<ValueType> out;
  for (int64_t s : sizes) {
    Shape shape = x->shape();
    shape[axis] = s;
    out.push_back({x->dtype(), shape});
  }
  return out;
}

// ---- Slice ----

Result<std::vector<ValueType>> InferSlice(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto starts, RequireConstInts(ctx, 1, "starts"));
  GF_ASSIGN_OR_RETURN(auto ends, RequireConstInts(ctx, 2, "ends"));
  std::vector<int64_t> axes, steps;
  if (ctx.input(3)) {
    GF_ASSIGN_OR_RETURN(axes, RequireConstInts(ctx, 3, "axes"));
  }
  if (ctx.input(4)) {
    GF_ASSIGN_OR_RETURN(steps, RequireConstInts(ctx, 4, "steps"));
  }
  GF_ASSIGN_OR_RETURN(SliceParams p, ComputeSlice(x->shape(), starts, ends, axes, steps, ctx.input(3) != nullptr,
                                                  ctx.input(4) != nullptr, ctx.Describe()));
  return std::vector<ValueType>{{x->dtype(), p.out}};
}

// ---- Gather ----

Result<std::vector<ValueType>> InferGather(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* idx = ctx.input(1);
  if (!IsIndexType(idx->dtype()))
    return InvalidArgument(ctx.Describe(), ": indices must be i32 or i64, not ", DTypeName(idx->dtype()));
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": Gather needs data of rank >= 1");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank));
  const int64_t dim = x->shape()[axis];
  if (ctx.ConstInput(1) != nullptr) {
    GF_ASSIGN_OR_RETURN(auto values, ctx.ConstInts(1, "indices"));
    for (int64_t v : values)
      if (v < -dim || v >= dim)
        return InvalidArgument(ctx.Describe(), ": index ", v, " is out of range for axis ", axis, " of size ", dim);
  }
  Shape out(x->shape().begin(), x->shape().begin() + axis);
  out.insert(out.end(), idx->shape().begin(), idx->shape().end());
  out.insert(out.end(), x->shape().begin() + axis + 1, x->shape().end());
  return std::vector<ValueType>{{x->dtype(), out}};
}

// ---- GatherElements: out[i..] = data[i.. with i_axis = indices[i..]] ----

Result<std::vector<ValueType>> InferGatherElements(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* idx = ctx.input(1);
  if (!IsIndexType(idx->dtype()))
    return InvalidArgument(ctx.Describe(), ": indices must be i32 or i64, not ", DTypeName(idx->dtype()));
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": GatherElements needs data of rank >= 1");
  if (idx->shape().size() != x->shape().size())
    return InvalidArgument(ctx.Describe(), ": indices ", idx->TypeString(), " must have data's rank (", x->TypeString(), ")");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", 0), rank));
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && idx->shape()[d] > x->shape()[d])
      return InvalidArgument(ctx.Describe(), ": indices ", idx->TypeString(), " exceed data ", x->TypeString(),
                             " along axis ", d);
  return std::vector<ValueType>{{x->dtype(), idx->shape()}};
}

// ---- Trilu: the upper (or lower) triangle of the last two dims, from diagonal k ----

Result<std::vector<ValueType>> InferTrilu(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  if (x->shape().size() < 2) return InvalidArgument(ctx.Describe(), ": Trilu needs rank >= 2, got ", x->TypeString());
  if (const Value* k = ctx.input(1); k && (k->dtype() != DType::kI64 || k->numel() != 1))
    return InvalidArgument(ctx.Describe(), ": k must be one i64 value, got ", k->TypeString());
  return std::vector<ValueType>{{x->dtype(), x->shape()}};
}

// ---- Expand ----

Result<std::vector<ValueType>> InferExpand(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto shape, RequireConstInts(ctx, 1, "shape"));
  const Shape shapes[2] = {x->shape(), shape};
  auto out = BroadcastShapes(shapes);
  if (!out.ok()) return InvalidArgument(ctx.Describe(), ": cannot expand: ", out.status().message());
  return std::vector<ValueType>{{x->dtype(), *out}};
}

}  // namespace

std::vector<OpSchema> DataMovementSchemas() {
  return {
      {"Transpose", 1, 1, 1, InferTranspose},
      {"Concat", 1, INT_MAX, 1, InferConcat},
      {"Split", 1, 2, -1, InferSplit},
      {"Slice", 3, 5, 1, InferSlice},
      {"Gather", 2, 2, 1, InferGather},
      {"GatherElements", 2, 2, 1, InferGatherElements},
      {"Trilu", 1, 2, 1, InferTrilu},
      {"Expand", 2, 2, 1, InferExpand},
  };
}

}  // namespace graphfuse::schemas
