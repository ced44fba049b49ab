// The unfused baseline: every elementwise op runs alone as a one-instruction tile program,
// or, for f32 operands of the output's own shape on one thread, as its kernel straight over
// the caller's arrays (RunContiguousF32: no tile program to plan, which is most of a small
// call's cost).
// The validation below runs on every launch, so its success path allocates nothing; the
// allocating shape/dtype rules of ops.h run only to word an error.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "ops/reference.h"
#include "graphfuse/cpu.h"
#include "cpu/tile_program.h"

namespace graphfuse {

int CpuContext::ThreadsFor(int64_t work) const {
  if (pool == nullptr) return 1;
  const int cap = max_threads > 0 ? std::min(max_threads, pool->num_threads()) : pool->num_threads();
  const int64_t grain = std::max<int64_t>(min_work_per_thread, 1);
  return static_cast<int>(std::clamp<int64_t>(work / grain, 1, cap));
}

namespace {

std::string Describe(OpKind kind, std::span<const TensorView> in) {
  std::string s = StrCat("op ", OpName(kind), "(");
  for (size_t i = 0; i < in.size(); ++i) s += StrCat(i ? ", " : "", DTypeName(in[i].dtype), ShapeToString(in[i].shape));
  return s + ")";
}

// Whether `out` is exactly the broadcast of the input shapes (no allocation).
bool IsBroadcastOf(const Shape& out, std::span<const TensorView> in) {
  size_t rank = 0;
  for (const TensorView& t : in) rank = std::max(rank, t.shape.size());
  if (out.size() != rank) return false;
  for (size_t k = 0; k < rank; ++k) {
    const int64_t o = out[rank - 1 - k];
    if (o < 0) return false;
    bool seen = (o == 1);
    for (const TensorView& t : in) {
      if (k >= t.shape.size()) continue;
      const int64_t d = t.shape[t.shape.size() - 1 - k];
      if (d == o) seen = true;
      else if (d != 1) return false;
    }
    if (!seen) return false;
  }
  return true;
}

// The full (allocating) rules, for the error message.
Status ExplainMismatch(OpKind kind, std::span<const TensorView> in, const TensorView& out, const OpAttrs& attrs) {
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : in) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_ASSIGN_OR_RETURN(DType out_dtype, InferDType(kind, dtypes, attrs));
  GF_ASSIGN_OR_RETURN(Shape out_shape, InferShape(kind, shapes));
  GF_RETURN_IF_ERROR(NumElements(out_shape).status());
  return InvalidArgument(Describe(kind, in), " produces ", DTypeName(out_dtype), ShapeToString(out_shape),
                         " but the output is ", DTypeName(out.dtype), ShapeToString(out.shape));
}

}  // namespace

namespace cpu {
TileProgram SingleOpProgram(OpKind kind, std::span<const TensorView> in, const TensorView& out, const OpAttrs& attrs) {
  std::array<DType, 3> dtype_buf{};
  for (size_t k = 0; k < in.size(); ++k) dtype_buf[k] = in[k].dtype;
  const Domain domain =
      ComputesInIntegers(kind, std::span<const DType>(dtype_buf.data(), in.size())) ? Domain::kI64 : Domain::kF32;
  TileProgram p;
  p.shape = TileShape(out.shape);
  for (const TensorView& t : in) p.inputs.push_back({t.dtype, t.data, TileStrides(t.shape, out.shape), domain});
  TileInstr ins{kind, {0, 0, 0}, attrs, domain};
  for (size_t a = 0; a < in.size(); ++a) ins.args[a] = static_cast<int>(a);
  p.instrs.push_back(ins);
  p.outputs.push_back({static_cast<int>(in.size()), out.dtype, out.data});
  return p;
}
}  // namespace cpu

Status RunOp(OpKind kind, std::span<const TensorView> in, const TensorView& out, const OpAttrs& attrs,
             const CpuContext& ctx) {
  const OpInfo& op = GetOpInfo(kind);
  if (static_cast<int>(in.size()) != op.arity)
    return InvalidArgument("op ", op.name, " takes ", op.arity, " input(s), got ", in.size());
  std::array<DType, 3> dtype_buf{};
  for (size_t k = 0; k < in.size(); ++k) dtype_buf[k] = in[k].dtype;
  const std::span<const DType> dtypes(dtype_buf.data(), in.size());
  auto out_dtype = InferDType(kind, dtypes, attrs);
  if (!out_dtype.ok()) return out_dtype.status();
  const bool bias_ok = kind != OpKind::kBias ||
                       (in[1].shape.size() == 1 && !in[0].shape.empty() && in[1].shape[0] == in[0].shape.back());
  if (*out_dtype != out.dtype || !bias_ok || !IsBroadcastOf(out.shape, in)) return ExplainMismatch(kind, in, out, attrs);
  GF_RETURN_IF_ERROR(CheckAttrs(kind, attrs));
  auto numel = NumElements(out.shape);
  if (!numel.ok()) return numel.status().WithContext(Describe(kind, in));
  if (out.shape.size() > cpu::kMaxTileRank)
    return Unimplemented(Describe(kind, in), ": rank ", out.shape.size(), " exceeds the supported ", cpu::kMaxTileRank);
  const int64_t n = *numel;
  if (n == 0) return Status::Ok();
  if (out.data == nullptr) return InvalidArgument(Describe(kind, in), ": output has no data");
  const size_t out_bytes = static_cast<size_t>(n) * DTypeSize(out.dtype);
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k].data == nullptr) return InvalidArgument(Describe(kind, in), ": input ", k, " has no data");
    // In place is fine when the input is read element for element where it is written.
    const size_t in_bytes = static_cast<size_t>(in[k].numel()) * DTypeSize(in[k].dtype);
    auto a = reinterpret_cast<uintptr_t>(in[k].data), b = reinterpret_cast<uintptr_t>(out.data);
    const bool overlap = a < b + out_bytes && b < a + in_bytes;
    if (overlap && !(a == b && in[k].shape == out.shape && in[k].dtype == out.dtype))
      return InvalidArgument(Describe(kind, in), ": the output overlaps input ", k,
                             " without being exactly it (same data, shape and dtype)");
  }

  // f32 operands of the output's own shape: nothing to broadcast, convert or plan.
  bool contiguous_f32 = out.dtype == DType::kF32;
  std::array<const float*, 3> ptrs{};
  for (size_t k = 0; k < in.size() && contiguous_f32; ++k) {
    contiguous_f32 = in[k].dtype == DType::kF32 && in[k].shape == out.shape;
    ptrs[k] = static_cast<const float*>(in[k].data);
  }
  if (contiguous_f32 && cpu::RunContiguousF32(kind, std::span<const float* const>(ptrs.data(), in.size()),
                                              static_cast<float*>(out.data), n, attrs, ctx))
    return Status::Ok();

  const cpu::TileProgram p = cpu::SingleOpProgram(kind, in, out, attrs);
  cpu::RunTileProgram(p, ctx);
  return Status::Ok();
}

Result<Tensor> RunOp(OpKind kind, std::span<const TensorView> in, const OpAttrs& attrs, const CpuContext& ctx) {
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : in) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_ASSIGN_OR_RETURN(DType dtype, InferDType(kind, dtypes, attrs));
  GF_ASSIGN_OR_RETURN(Shape shape, InferShape(kind, shapes));
  GF_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, shape));
  GF_RETURN_IF_ERROR(RunOp(kind, in, out.view(), attrs, ctx));
  return out;
}

}  // namespace graphfuse
