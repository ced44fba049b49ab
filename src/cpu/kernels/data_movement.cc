// Data movement, dtype-generic (elements are moved as DTypeSize bytes):
//   Transpose (perm, default reversed), Concat (axis), Split (split input, num_outputs, or the
//   output shapes), Slice (starts/ends/axes/steps inputs, ONNX clamping, negative steps),
//   Gather (axis, negative indices), GatherElements, Trilu, Expand (bidirectional broadcast to a
//   constant shape), GatherND, ScatterND, Tile, Pad.
// Transpose, Slice, Expand and Tile are one strided copy: the output is contiguous and the
// source is read with per-dim strides (permuted, stepped, or 0 for broadcast dims).
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/data_movement.cc.
#include <cstring>
#include <type_traits>
#include <vector>

#include "ir/schemas/data_movement.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"

namespace graphfuse::kernels {
namespace {

using schemas::ComputeGatherND;
using schemas::ComputePad;
using schemas::ComputeSlice;
using schemas::GatherNDParams;
using schemas::kPadFill;
using schemas::PadParams;
using schemas::PadSource;
using schemas::SliceParams;
using schemas::TransposePerm;

// Copies one element of a fixed size.
template <size_t N>
inline void CopyElem(char* dst, const char* src) {
  std::memcpy(dst, src, N);
}

// Runs f.template operator()<N>() with N = esize for the common element sizes, 0 otherwise.
template <class F>
void BySize(size_t esize, F&& f) {
  switch (esize) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 4: f.template operator()<4>(); break;
    case 8: f.template operator()<8>(); break;
    default: f.template operator()<0>(); break;
  }
}

// The 2-D transpose inside a strided copy: source dim `j` is contiguous (stride 1) while the
// innermost output dim is not. Copied in kTile x kTile blocks so both sides stay in L1.
void TiledCopy(const CpuContext& cpu, char* out, const char* in, const Shape& s, const std::vector<int64_t>& st,
               size_t j, size_t esize) {
  constexpr int64_t kTile = 32;
  const size_t last = s.size() - 1;
  const int64_t nj = s[j], nl = s[last], sl = st[last];
  const std::vector<int64_t> dst_st = ContiguousStrides(s);
  const int64_t dj = dst_st[j];
  Shape os;
  std::vector<int64_t> o_src, o_dst;
  for (size_t k = 0; k < last; ++k)
    if (k != j) os.push_back(s[k]), o_src.push_back(st[k]), o_dst.push_back(dst_st[k]);
  const int64_t tiles_j = (nj + kTile - 1) / kTile, items = Product(os) * tiles_j;
  const int64_t e = static_cast<int64_t>(esize);
  ParallelFor(cpu, items, kTile * nl * e / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it) {
      int64_t rem = it / tiles_j, src = 0, dst = 0;
      for (size_t k = os.size(); k-- > 0;) {
        const int64_t idx = rem % os[k];
        rem /= os[k];
        src += idx * o_src[k], dst += idx * o_dst[k];
      }
      const int64_t a0 = (it % tiles_j) * kTile, a1 = std::min(a0 + kTile, nj);
      BySize(esize, [&]<size_t N>() {
        for (int64_t b0 = 0; b0 < nl; b0 += kTile) {
          const int64_t b1 = std::min(b0 + kTile, nl);
          for (int64_t a = a0; a < a1; ++a) {
            char* d = out + (dst + a * dj) * e;
            const char* p = in + (src + a) * e;
            for (int64_t b = b0; b < b1; ++b) {
              if constexpr (N > 0) CopyElem<N>(d + b * e, p + b * sl * e);
              else std::memcpy(d + b * e, p + b * sl * e, esize);
            }
          }
        }
      });
    }
  });
}

// dst (contiguous, shape `shape`) = src read with element strides `strides` (any sign).
void StridedCopy(const CpuContext& cpu, void* dst, const void* src, Shape shape, std::vector<int64_t> strides,
                 size_t esize) {
  // Drop size-1 dims, then merge a dim into the next when the source is contiguous across them.
  Shape s;
  std::vector<int64_t> st;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return;
    if (shape[i] == 1) continue;
    if (!s.empty() && st.back() == strides[i] * shape[i]) {
      s.back() *= shape[i];
      st.back() = strides[i];
    } else {
      s.push_back(shape[i]);
      st.push_back(strides[i]);
    }
  }
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(dst);
  if (s.empty()) {
    std::memcpy(out, in, esize);
    return;
  }
  const int64_t n = s.back(), inner_stride = st.back(), e = static_cast<int64_t>(esize);
  if (inner_stride != 1 && inner_stride != 0) {
    for (size_t j = 0; j + 1 < s.size(); ++j)
      if (st[j] == 1 && s[j] > 1) return TiledCopy(cpu, out, in, s, st, j, esize);
  }
  s.pop_back(), st.pop_back();
  const int64_t rows = Product(s);
  ParallelFor(cpu, rows, n * e / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t off = 0, rem = r;
      for (size_t k = s.size(); k-- > 0;) off += (rem % s[k]) * st[k], rem /= s[k];
      const char* p = in + off * e;
      char* q = out + r * n * e;
      if (inner_stride == 1) {
        std::memcpy(q, p, static_cast<size_t>(n * e));
        continue;
      }
      BySize(esize, [&]<size_t N>() {
        for (int64_t j = 0; j < n; ++j) {
          if constexpr (N > 0) CopyElem<N>(q + j * e, p + j * inner_stride * e);
          else std::memcpy(q + j * e, p + j * inner_stride * e, esize);
        }
      });
    }
  });
}

// ---- Transpose ----

Status TransposeKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  GF_ASSIGN_OR_RETURN(auto perm, TransposePerm(ctx.node.GetInts("perm"), ctx.node.has_attr("perm"), X.shape.size(),
                                               KernelWhere(ctx)));
  const std::vector<int64_t> in_st = ContiguousStrides(X.shape);
  Shape out(perm.size());
  std::vector<int64_t> st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[i] = X.shape[perm[i]], st[i] = in_st[perm[i]];
  StridedCopy(ctx.cpu, ctx.outputs[0].data, X.data, out, st, DTypeSize(X.dtype));
  return Status::Ok();
}

// ---- Concat ----

Status ConcatKernel(const KernelContext& ctx) {
  const TensorView& Y = ctx.outputs[0];
  const int64_t rank = static_cast<int64_t>(Y.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", 0, rank));
  const int64_t esize = static_cast<int64_t>(DTypeSize(Y.dtype));
  const int64_t outer = Product(Y.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(Y.shape, static_cast<size_t>(axis) + 1, Y.shape.size()) * esize;
  const int64_t row = Y.shape[axis] * inner;  // bytes of one output row
  char* out = static_cast<char*>(Y.data);
  ParallelFor(ctx.cpu, outer, row / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      int64_t pos = o * row;
      for (const TensorView& in : ctx.inputs) {
        const int64_t chunk = in.shape[axis] * inner;
        if (chunk) std::memcpy(out + pos, static_cast<const char*>(in.data) + o * chunk, static_cast<size_t>(chunk));
        pos += chunk;
      }
    }
  });
  return Status::Ok();
}

// ---- Split ----

Status SplitKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", 0, rank));
  // The output shapes carry the sizes, whichever way the node gave them.
  int64_t total = 0;
  for (const TensorView& o : ctx.outputs) total += o.shape[axis];
  if (total > X.shape[axis])
    return InvalidArgument(KernelWhere(ctx), ": outputs take ", total, " along axis ", axis, " of size ", X.shape[axis]);
  const int64_t esize = static_cast<int64_t>(DTypeSize(X.dtype));
  const int64_t outer = Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size()) * esize;
  const int64_t row = X.shape[axis] * inner;
  const char* in = static_cast<const char*>(X.data);
  ParallelFor(ctx.cpu, outer, row / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      int64_t pos = o * row;
      for (const TensorView& out : ctx.outputs) {
        const int64_t chunk = out.shape[axis] * inner;
        if (chunk) std::memcpy(static_cast<char*>(out.data) + o * chunk, in + pos, static_cast<size_t>(chunk));
        pos += chunk;
      }
    }
  });
  return Status::Ok();
}

// ---- Slice ----

Status SliceKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const bool has_axes = HasInput(ctx, 3), has_steps = HasInput(ctx, 4);
  GF_ASSIGN_OR_RETURN(SliceParams p, ComputeSlice(X.shape, ReadInts(ctx.inputs[1]), ReadInts(ctx.inputs[2]),
                                                  has_axes ? ReadInts(ctx.inputs[3]) : std::vector<int64_t>{},
                                                  has_steps ? ReadInts(ctx.inputs[4]) : std::vector<int64_t>{},
                                                  has_axes, has_steps, KernelWhere(ctx)));
  if (p.out != ctx.outputs[0].shape)
    return InvalidArgument(KernelWhere(ctx), ": slice gives ", ShapeToString(p.out), " but the output is ",
                           ShapeToString(ctx.outputs[0].shape));
  const std::vector<int64_t> in_st = ContiguousStrides(X.shape);
  int64_t off = 0;
  std::vector<int64_t> st(X.shape.size());
  for (size_t d = 0; d < X.shape.size(); ++d) off += p.start[d] * in_st[d], st[d] = in_st[d] * p.step[d];
  const size_t esize = DTypeSize(X.dtype);
  StridedCopy(ctx.cpu, ctx.outputs[0].data, static_cast<const char*>(X.data) + off * static_cast<int64_t>(esize), p.out,
              st, esize);
  return Status::Ok();
}

// ---- Gather ----

Status GatherKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", 0, rank));
  const int64_t dim = X.shape[axis];
  std::vector<int64_t> idx = ReadInts(ctx.inputs[1]);
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] < -dim || idx[j] >= dim)
      return InvalidArgument(KernelWhere(ctx), ": index ", idx[j], " (position ", j, ") is out of range for axis ",
                             axis, " of size ", dim);
    if (idx[j] < 0) idx[j] += dim;
  }
  const int64_t esize = static_cast<int64_t>(DTypeSize(X.dtype));
  const int64_t outer = Product(X.shape, 0, static_cast<size_t>(axis));
  const int64_t inner = Product(X.shape, static_cast<size_t>(axis) + 1, X.shape.size()) * esize;
  const int64_t nidx = static_cast<int64_t>(idx.size());
  const char* in = static_cast<const char*>(X.data);
  char* out = static_cast<char*>(ctx.outputs[0].data);
  if (inner == 0) return Status::Ok();
  ParallelFor(ctx.cpu, outer * nidx, inner / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / nidx, j = t % nidx;
      std::memcpy(out + t * inner, in + (o * dim + idx[j]) * inner, static_cast<size_t>(inner));
    }
  });
  return Status::Ok();
}

// ---- GatherElements ----

Status GatherElementsKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& I = ctx.inputs[1];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", 0, rank));
  const int64_t dim = X.shape[axis];
  const std::vector<int64_t> idx = ReadInts(I);
  // Row-major strides of the data; the output walks the indices' shape.
  std::vector<int64_t> xs(static_cast<size_t>(rank), 1);
  for (int64_t d = rank - 2; d >= 0; --d) xs[d] = xs[d + 1] * X.shape[d + 1];
  const size_t esize = DTypeSize(X.dtype);
  const char* in = static_cast<const char*>(X.data);
  char* out = static_cast<char*>(ctx.outputs[0].data);
  std::vector<int64_t> pos(static_cast<size_t>(rank), 0);
  for (int64_t t = 0; t < static_cast<int64_t>(idx.size()); ++t) {
    int64_t j = idx[t];
    if (j < -dim || j >= dim)
      return InvalidArgument(KernelWhere(ctx), ": index ", j, " (position ", t, ") is out of range for axis ", axis,
                             " of size ", dim);
    if (j < 0) j += dim;
    int64_t src = 0;
    for (int64_t d = 0; d < rank; ++d) src += (d == axis ? j : pos[d]) * xs[d];
    std::memcpy(out + t * esize, in + src * static_cast<int64_t>(esize), esize);
    for (int64_t d = rank - 1; d >= 0 && ++pos[d] == I.shape[d]; --d) pos[d] = 0;  // next output position
  }
  return Status::Ok();
}

// ---- Trilu ----

Status TriluKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t k = ctx.inputs.size() > 1 && ctx.inputs[1].data ? ReadInts(ctx.inputs[1]).at(0) : 0;
  const bool upper = ctx.node.GetInt("upper", 1) != 0;
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  const int64_t rows = X.shape[rank - 2], cols = X.shape[rank - 1];
  const int64_t mats = X.numel() / std::max<int64_t>(rows * cols, 1);
  const size_t esize = DTypeSize(X.dtype);
  const char* in = static_cast<const char*>(X.data);
  char* out = static_cast<char*>(ctx.outputs[0].data);
  ParallelFor(ctx.cpu, mats * rows, cols + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % rows;
      for (int64_t j = 0; j < cols; ++j) {
        const size_t at = static_cast<size_t>(r * cols + j) * esize;
        const bool keep = upper ? j - i >= k : j - i <= k;
        if (keep) std::memcpy(out + at, in + at, esize);
        else std::memset(out + at, 0, esize);  // zero in every dtype
      }
    }
  });
  return Status::Ok();
}

// ---- Expand ----

Status ExpandKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& Y = ctx.outputs[0];
  const Shape shapes[2] = {X.shape, Y.shape};
  auto check = BroadcastShapes(shapes);
  if (!check.ok() || *check != Y.shape)
    return InvalidArgument(KernelWhere(ctx), ": input ", ShapeToString(X.shape), " does not expand to ",
                           ShapeToString(Y.shape));
  StridedCopy(ctx.cpu, Y.data, X.data, Y.shape, BroadcastStrides(X.shape, Y.shape), DTypeSize(X.dtype));
  return Status::Ok();
}

// ---- GatherND / ScatterND ----

// The element offset in data of the slice each index tuple addresses: tuple t of batch b is
// indices[(b * per_batch + t) * m ..][0, m), over data's dims batch_dims .. batch_dims + m.
// Negative indices count from the end; one out of range is an error naming it.
Result<std::vector<int64_t>> SliceOffsets(const KernelContext& ctx, const TensorView& data, const TensorView& indices,
                                          const GatherNDParams& p) {
  const std::vector<int64_t> idx = ReadInts(indices);
  const size_t b = static_cast<size_t>(p.batch_dims);
  const int64_t batches = Product(data.shape, 0, b);
  const int64_t batch_elems = Product(data.shape, b, data.shape.size());
  const int64_t tuples = p.m ? static_cast<int64_t>(idx.size()) / p.m : 0;
  const int64_t per_batch = batches ? tuples / batches : 0;
  std::vector<int64_t> offsets(static_cast<size_t>(tuples));
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = (t / std::max<int64_t>(per_batch, 1)) * batch_elems, stride = batch_elems;
    for (int64_t k = 0; k < p.m; ++k) {
      const int64_t dim = data.shape[b + static_cast<size_t>(k)];
      int64_t i = idx[t * p.m + k];
      if (i < -dim || i >= dim)
        return InvalidArgument(KernelWhere(ctx), ": index ", i, " (indices position ", t * p.m + k,
                               ") is out of range for data dim ", b + static_cast<size_t>(k), " of size ", dim);
      if (i < 0) i += dim;
      stride /= dim;
      off += i * stride;
    }
    offsets[t] = off;
  }
  return offsets;
}

Status GatherNDKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  GF_ASSIGN_OR_RETURN(GatherNDParams p, ComputeGatherND(X.shape, ctx.inputs[1].shape, ctx.node.GetInt("batch_dims", 0),
                                                        KernelWhere(ctx)));
  GF_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, SliceOffsets(ctx, X, ctx.inputs[1], p));
  const size_t esize = DTypeSize(X.dtype);
  const int64_t slice =
      Product(X.shape, static_cast<size_t>(p.batch_dims + p.m), X.shape.size()) * static_cast<int64_t>(esize);
  const char* in = static_cast<const char*>(X.data);
  char* out = static_cast<char*>(ctx.outputs[0].data);
  if (slice == 0) return Status::Ok();
  ParallelFor(ctx.cpu, static_cast<int64_t>(offsets.size()), slice / 4 + 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      std::memcpy(out + t * slice, in + offsets[t] * static_cast<int64_t>(esize), static_cast<size_t>(slice));
  });
  return Status::Ok();
}

enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

// a + b or a * b; integers wrap (two's complement) instead of overflowing.
template <class T>
T Arith(T a, T b, bool mul) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    const U ua = static_cast<U>(a), ub = static_cast<U>(b);
    return static_cast<T>(static_cast<U>(mul ? ua * ub : ua + ub));
  } else {
    return mul ? a * b : a + b;
  }
}

// dst[i] = dst[i] (op) src[i] for n elements of f32 or an integer type.
template <class T>
void Combine(T* dst, const T* src, int64_t n, ScatterReduction r) {
  for (int64_t i = 0; i < n; ++i) {
    const T a = dst[i], b = src[i];
    switch (r) {
      case ScatterReduction::kAdd: dst[i] = Arith(a, b, false); break;
      case ScatterReduction::kMul: dst[i] = Arith(a, b, true); break;
      // NaN-propagating, as numpy's maximum / minimum.
      case ScatterReduction::kMax: dst[i] = (a != a || b != b) ? a + b : (a < b ? b : a); break;
      case ScatterReduction::kMin: dst[i] = (a != a || b != b) ? a + b : (b < a ? b : a); break;
      case ScatterReduction::kNone: dst[i] = b; break;
    }
  }
}

// f16 / bf16: combined in f32 (exact operands; one rounding to the storage type).
void CombineHalf(DType t, uint16_t* dst, const uint16_t* src, int64_t n, ScatterReduction r) {
  float a[256], b[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    const int64_t m = std::min<int64_t>(256, n - i0);
    LoadF32(t, dst, i0, 1, m, a);
    LoadF32(t, src, i0, 1, m, b);
    Combine(a, b, m, r);
    StoreF32(t, dst, i0, 1, m, a);
  }
}

// Copies data, then applies the updates slice by slice in the order of the indices (so with
// reduction none a repeated index keeps its last update).
Status ScatterNDKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& U = ctx.inputs[2];
  GF_ASSIGN_OR_RETURN(GatherNDParams p, ComputeGatherND(X.shape, ctx.inputs[1].shape, 0, KernelWhere(ctx)));
  if (U.shape != p.out || U.dtype != X.dtype)
    return InvalidArgument(KernelWhere(ctx), ": updates must be ", TypeStr(X.dtype, p.out));
  GF_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, SliceOffsets(ctx, X, ctx.inputs[1], p));
  const std::string red = ctx.node.GetString("reduction", "none");
  const ScatterReduction r = red == "add"   ? ScatterReduction::kAdd
                             : red == "mul" ? ScatterReduction::kMul
                             : red == "max" ? ScatterReduction::kMax
                             : red == "min" ? ScatterReduction::kMin
                                            : ScatterReduction::kNone;
  const size_t esize = DTypeSize(X.dtype);
  const int64_t slice = Product(X.shape, static_cast<size_t>(p.m), X.shape.size());
  char* out = static_cast<char*>(ctx.outputs[0].data);
  const char* upd = static_cast<const char*>(U.data);
  if (out != X.data && X.numel() > 0) std::memcpy(out, X.data, static_cast<size_t>(X.numel()) * esize);
  for (size_t t = 0; t < offsets.size(); ++t) {
    char* dst = out + offsets[t] * static_cast<int64_t>(esize);
    const char* src = upd + static_cast<int64_t>(t) * slice * static_cast<int64_t>(esize);
    if (r == ScatterReduction::kNone) {
      std::memcpy(dst, src, static_cast<size_t>(slice) * esize);
      continue;
    }
    switch (X.dtype) {
      case DType::kF32:
        Combine(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src), slice, r);
        break;
      case DType::kI32:
        Combine(reinterpret_cast<int32_t*>(dst), reinterpret_cast<const int32_t*>(src), slice, r);
        break;
      case DType::kI64:
        Combine(reinterpret_cast<int64_t*>(dst), reinterpret_cast<const int64_t*>(src), slice, r);
        break;
      case DType::kF16:
      case DType::kBF16:
        CombineHalf(X.dtype, reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src), slice, r);
        break;
      default: return Unimplemented(KernelWhere(ctx), ": reduction '", red, "' on ", DTypeName(X.dtype));
    }
  }
  return Status::Ok();
}

// ---- Tile ----

// out[r0*d0 + i0, ...] = x[i0, ...]: the output seen as [r0, d0, r1, d1, ...] is x broadcast
// along the repeat dims, one strided copy.
Status TileKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const std::vector<int64_t> repeats = ReadInts(ctx.inputs[1]);
  if (repeats.size() != X.shape.size())
    return InvalidArgument(KernelWhere(ctx), ": repeats ", ShapeToString(repeats), " must have one value per dim");
  const std::vector<int64_t> in_st = ContiguousStrides(X.shape);
  Shape shape;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < X.shape.size(); ++d) {
    if (repeats[d] * X.shape[d] != ctx.outputs[0].shape[d])
      return InvalidArgument(KernelWhere(ctx), ": repeats ", ShapeToString(repeats), " do not give the output ",
                             TypeStr(ctx.outputs[0]));
    shape.push_back(repeats[d]), strides.push_back(0);
    shape.push_back(X.shape[d]), strides.push_back(in_st[d]);
  }
  if (ctx.outputs[0].numel() == 0) return Status::Ok();
  StridedCopy(ctx.cpu, ctx.outputs[0].data, X.data, shape, strides, DTypeSize(X.dtype));
  return Status::Ok();
}

// ---- Pad ----

// Each output row (all dims but the last) reads one input row, or is all constant; within the
// row the unpadded run is one memcpy and the padding reads through PadSource.
Status PadKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& Y = ctx.outputs[0];
  const bool has_axes = HasInput(ctx, 3);
  GF_ASSIGN_OR_RETURN(PadParams p, ComputePad(X.shape, ReadInts(ctx.inputs[1]),
                                              has_axes ? ReadInts(ctx.inputs[3]) : std::vector<int64_t>{}, has_axes,
                                              ctx.node.GetString("mode", "constant"), KernelWhere(ctx)));
  if (p.out != Y.shape)
    return InvalidArgument(KernelWhere(ctx), ": pads give ", ShapeToString(p.out), " but the output is ", TypeStr(Y));
  const size_t esize = DTypeSize(X.dtype);
  std::vector<char> fill(esize, 0);  // zero bits are 0 in every dtype
  if (HasInput(ctx, 2) && ctx.inputs[2].numel() == 1) {
    if (ctx.inputs[2].dtype != X.dtype)
      return InvalidArgument(KernelWhere(ctx), ": constant_value must be ", DTypeName(X.dtype));
    std::memcpy(fill.data(), ctx.inputs[2].data, esize);
  }
  if (Y.numel() == 0) return Status::Ok();
  const size_t rank = X.shape.size();
  if (rank == 0) {
    std::memcpy(Y.data, X.data, esize);
    return Status::Ok();
  }
  // Per dim, the input index each output index reads.
  std::vector<std::vector<int64_t>> src(rank);
  for (size_t d = 0; d < rank; ++d)
    for (int64_t o = 0; o < p.out[d]; ++o) src[d].push_back(PadSource(o, p.begin[d], X.shape[d], p.mode));
  const int64_t n = p.out[rank - 1], xn = X.shape[rank - 1], begin = p.begin[rank - 1];
  const int64_t run_lo = std::clamp<int64_t>(begin, 0, n), run_hi = std::clamp<int64_t>(begin + xn, run_lo, n);
  const std::vector<int64_t> in_st = ContiguousStrides(X.shape);
  const Shape rows_shape(p.out.begin(), p.out.end() - 1);
  const int64_t rows = Product(rows_shape);
  const char* in = static_cast<const char*>(X.data);
  char* out = static_cast<char*>(Y.data);
  const int64_t e = static_cast<int64_t>(esize);
  ParallelFor(ctx.cpu, rows, n * e / 4 + 1, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      char* q = out + r * n * e;
      int64_t off = 0, rem = r;
      bool constant_row = false;
      for (size_t d = rank - 1; d-- > 0;) {
        const int64_t s = src[d][rem % rows_shape[d]];
        rem /= rows_shape[d];
        if (s == kPadFill) constant_row = true;
        else off += s * in_st[d];
      }
      for (int64_t j = 0; j < n; ++j) {
        if (!constant_row && j == run_lo && run_hi > run_lo) {  // the unpadded run
          std::memcpy(q + j * e, in + (off + j - begin) * e, static_cast<size_t>((run_hi - run_lo) * e));
          j = run_hi - 1;
          continue;
        }
        const int64_t s = constant_row ? kPadFill : src[rank - 1][j];
        std::memcpy(q + j * e, s == kPadFill ? fill.data() : in + (off + s) * e, esize);
      }
    }
  });
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> DataMovementKernels() {
  return {
      {"Transpose", TransposeKernel},
      {"Concat", ConcatKernel},
      {"Split", SplitKernel},
      {"Slice", SliceKernel},
      {"Gather", GatherKernel},
      {"GatherElements", GatherElementsKernel},
      {"Trilu", TriluKernel},
      {"Expand", ExpandKernel},
      {"GatherND", GatherNDKernel},
      {"ScatterND", ScatterNDKernel},
      {"Tile", TileKernel},
      {"Pad", PadKernel},
  };
}

}  // namespace graphfuse::kernels
