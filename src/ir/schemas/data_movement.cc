// Data movement, dtype-generic: inference. The CPU kernels are in
// src/cpu/kernels/data_movement.cc.
//   Transpose (perm, default reversed), Concat (axis), Split (split input, num_outputs, or the
//   output shapes), Slice (starts/ends/axes/steps inputs, ONNX clamping, negative steps),
//   Gather (axis, negative indices), GatherElements (indices of data's rank, along axis),
//   Trilu (upper / lower triangle from diagonal k), Expand (bidirectional broadcast to a constant
//   shape), GatherND (batch_dims), ScatterND (reduction none / add / mul / max / min), Tile
//   (constant repeats), Pad (constant / reflect / edge / wrap; constant pads and axes).
#include "ir/schemas/data_movement.h"

#include <climits>

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

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

Result<GatherNDParams> ComputeGatherND(const Shape& data, const Shape& indices, int64_t batch_dims,
                                        const std::string& where) {
  const int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(indices.size());
  if (r < 1 || q < 1)
    return InvalidArgument(where, ": data ", ShapeToString(data), " and indices ", ShapeToString(indices),
                           " must have rank >= 1");
  if (batch_dims < 0 || batch_dims >= std::min(q, r))
    return InvalidArgument(where, ": batch_dims ", batch_dims, " must be in [0, ", std::min(q, r) - 1, "]");
  GatherNDParams p;
  p.batch_dims = batch_dims;
  p.m = indices.back();
  if (p.m < 1 || p.m > r - batch_dims)
    return InvalidArgument(where, ": the last dim of indices ", ShapeToString(indices), " is ", p.m,
                           ", it must be in [1, ", r - batch_dims, "] for data ", ShapeToString(data));
  for (int64_t d = 0; d < batch_dims; ++d)
    if (data[d] != indices[d])
      return InvalidArgument(where, ": batch dim ", d, " of data ", ShapeToString(data), " and indices ",
                             ShapeToString(indices), " differ");
  p.out.assign(indices.begin(), indices.end() - 1);
  p.out.insert(p.out.end(), data.begin() + batch_dims + p.m, data.end());
  return p;
}

// Where output position o of a padded dim reads (kPadFill: the constant), for an input dim of n.
int64_t PadSource(int64_t o, int64_t begin, int64_t n, PadMode mode) {
  const int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kConstant: return kPadFill;
    case PadMode::kEdge: return i < 0 ? 0 : n - 1;
    case PadMode::kWrap: return ((i % n) + n) % n;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      const int64_t k = ((i % period) + period) % period;
      return k < n ? k : period - k;
    }
  }
  return kPadFill;
}

Result<PadParams> ComputePad(const Shape& shape, const std::vector<int64_t>& pads, std::vector<int64_t> axes,
                             bool has_axes, const std::string& mode, const std::string& where) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  PadParams p;
  if (mode == "constant") p.mode = PadMode::kConstant;
  else if (mode == "reflect") p.mode = PadMode::kReflect;
  else if (mode == "edge") p.mode = PadMode::kEdge;
  else if (mode == "wrap") p.mode = PadMode::kWrap;
  else return InvalidArgument(where, ": mode '", mode, "' is not constant, reflect, edge or wrap");
  if (!has_axes) {
    axes.resize(static_cast<size_t>(rank));
    for (int64_t d = 0; d < rank; ++d) axes[d] = d;
  }
  if (pads.size() != 2 * axes.size())
    return InvalidArgument(where, ": pads ", ShapeToString(pads), " must hold 2 values per padded axis (",
                           axes.size(), " axes of ", ShapeToString(shape), ")");
  p.begin.assign(static_cast<size_t>(rank), 0);
  p.out = shape;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = axes[k];
    if (a < -rank || a >= rank) return InvalidArgument(where, ": axis ", a, " is out of range for rank ", rank);
    if (a < 0) a += rank;
    if (seen[a]) return InvalidArgument(where, ": axes ", ShapeToString(axes), " repeat axis ", axes[k]);
    seen[a] = true;
    const int64_t begin = pads[k], end = pads[k + axes.size()];
    int64_t out = 0;
    if (__builtin_add_overflow(shape[a], begin, &out) || __builtin_add_overflow(out, end, &out) || out < 0)
      return InvalidArgument(where, ": pads ", ShapeToString(pads), " give axis ", a, " of size ", shape[a],
                             " a size below 0");
    if (shape[a] == 0 && out > 0 && p.mode != PadMode::kConstant)
      return InvalidArgument(where, ": axis ", a, " is empty: '", mode, "' padding has nothing to repeat");
    p.begin[a] = begin;
    p.out[a] = out;
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

// ---- GatherND: slices of data addressed by the last dim of indices, after batch_dims ----

Result<std::vector<ValueType>> InferGatherND(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* idx = ctx.input(1);
  if (!IsIndexType(idx->dtype()))
    return InvalidArgument(ctx.Describe(), ": indices must be i32 or i64, not ", DTypeName(idx->dtype()));
  GF_ASSIGN_OR_RETURN(GatherNDParams p, ComputeGatherND(x->shape(), idx->shape(), ctx.GetInt("batch_dims", 0),
                                                        ctx.Describe()));
  return std::vector<ValueType>{{x->dtype(), p.out}};
}

// ---- ScatterND: data with the slices addressed by indices replaced (or combined) by updates ----

Result<std::vector<ValueType>> InferScatterND(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* idx = ctx.input(1);
  const Value* upd = ctx.input(2);
  if (!IsIndexType(idx->dtype()))
    return InvalidArgument(ctx.Describe(), ": indices must be i32 or i64, not ", DTypeName(idx->dtype()));
  if (upd->dtype() != x->dtype())
    return InvalidArgument(ctx.Describe(), ": updates ", upd->TypeString(), " must have data's dtype (",
                           x->TypeString(), ")");
  // The updates are what GatherND (batch_dims 0) would read at the same indices.
  GF_ASSIGN_OR_RETURN(GatherNDParams p, ComputeGatherND(x->shape(), idx->shape(), 0, ctx.Describe()));
  if (upd->shape() != p.out)
    return InvalidArgument(ctx.Describe(), ": updates ", upd->TypeString(), " must have the shape ",
                           ShapeToString(p.out), " (indices[:-1] + data[indices.shape[-1]:])");
  const std::string reduction = AttrString(ctx.attrs, "reduction", "none");
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min")
    return InvalidArgument(ctx.Describe(), ": reduction '", reduction, "' is not none, add, mul, max or min");
  if (reduction != "none" && x->dtype() == DType::kBool)
    return Unimplemented(ctx.Describe(), ": reduction '", reduction, "' on bool is not supported");
  return std::vector<ValueType>{{x->dtype(), x->shape()}};
}

// ---- Tile: the input repeated along each dim, repeats a constant input ----

Result<std::vector<ValueType>> InferTile(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto repeats, RequireConstInts(ctx, 1, "repeats"));
  if (repeats.size() != x->shape().size())
    return InvalidArgument(ctx.Describe(), ": repeats ", ShapeToString(repeats), " must have one value per dim of ",
                           x->TypeString());
  Shape out = x->shape();
  for (size_t d = 0; d < out.size(); ++d) {
    if (repeats[d] < 0)
      return InvalidArgument(ctx.Describe(), ": repeats ", ShapeToString(repeats), " has a negative value");
    if (__builtin_mul_overflow(out[d], repeats[d], &out[d]))
      return InvalidArgument(ctx.Describe(), ": repeats ", ShapeToString(repeats), " overflow dim ", d);
  }
  return std::vector<ValueType>{{x->dtype(), out}};
}

// ---- Pad: constant / reflect / edge / wrap, pads (and opset 18 axes) constant inputs ----

Result<std::vector<ValueType>> InferPad(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto pads, RequireConstInts(ctx, 1, "pads"));
  std::vector<int64_t> axes;
  if (ctx.input(3)) {
    GF_ASSIGN_OR_RETURN(axes, RequireConstInts(ctx, 3, "axes"));
  }
  if (const Value* c = ctx.input(2); c && (c->dtype() != x->dtype() || c->numel() > 1))
    return InvalidArgument(ctx.Describe(), ": constant_value ", c->TypeString(), " must be one value of data's dtype (",
                           x->TypeString(), ")");
  GF_ASSIGN_OR_RETURN(PadParams p, ComputePad(x->shape(), pads, axes, ctx.input(3) != nullptr,
                                              AttrString(ctx.attrs, "mode", "constant"), ctx.Describe()));
  return std::vector<ValueType>{{x->dtype(), p.out}};
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
      {"GatherND", 2, 2, 1, InferGatherND},
      {"ScatterND", 3, 3, 1, InferScatterND},
      {"Tile", 2, 2, 1, InferTile},
      {"Pad", 2, 4, 1, InferPad},
  };
}

}  // namespace graphfuse::schemas
