// The unfused baseline: every elementwise op runs alone as a one-instruction tile program.
#include <algorithm>
#include <string>
#include <vector>

#include "../ops/reference.h"
#include "graphfuse/cpu.h"
#include "tile_program.h"

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

}  // namespace

Status RunOp(OpKind kind, std::span<const TensorView> in, const TensorView& out, const OpAttrs& attrs,
             const CpuContext& ctx) {
  const OpInfo& op = GetOpInfo(kind);
  if (static_cast<int>(in.size()) != op.arity)
    return InvalidArgument("op ", op.name, " takes ", op.arity, " input(s), got ", in.size());
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : in) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_ASSIGN_OR_RETURN(DType out_dtype, InferDType(kind, dtypes, attrs));
  GF_ASSIGN_OR_RETURN(Shape out_shape, InferShape(kind, shapes));
  GF_RETURN_IF_ERROR(CheckAttrs(kind, attrs));
  const std::string what = Describe(kind, in);
  if (out.dtype != out_dtype || out.shape != out_shape)
    return InvalidArgument(what, " produces ", DTypeName(out_dtype), ShapeToString(out_shape),
                           " but the output is ", DTypeName(out.dtype), ShapeToString(out.shape));
  GF_ASSIGN_OR_RETURN(int64_t n, NumElements(out_shape));
  if (n == 0) return Status::Ok();
  const size_t out_bytes = static_cast<size_t>(n) * DTypeSize(out.dtype);
  if (out.data == nullptr) return InvalidArgument(what, ": output has no data");
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k].data == nullptr) return InvalidArgument(what, ": input ", k, " has no data");
    // In place is fine when the input is read element for element where it is written.
    const size_t in_bytes = static_cast<size_t>(in[k].numel()) * DTypeSize(in[k].dtype);
    auto a = reinterpret_cast<uintptr_t>(in[k].data), b = reinterpret_cast<uintptr_t>(out.data);
    const bool overlap = a < b + out_bytes && b < a + in_bytes;
    if (overlap && !(a == b && in[k].shape == out.shape && in[k].dtype == out.dtype))
      return InvalidArgument(what, ": the output overlaps input ", k,
                             " without being exactly it (same data, shape and dtype)");
  }

  const cpu::Domain domain = ComputesInIntegers(kind, dtypes) ? cpu::Domain::kI64 : cpu::Domain::kF32;
  cpu::TileProgram p;
  p.shape = out_shape;
  for (const TensorView& t : in) p.inputs.push_back({t.dtype, t.data, BroadcastStrides(t.shape, out_shape), domain});
  cpu::TileInstr ins{kind, {0, 1, 2}, attrs, domain};
  for (int a = op.arity; a < 3; ++a) ins.args[a] = 0;
  p.instrs.push_back(ins);
  p.outputs.push_back({static_cast<int>(in.size()), out.dtype, out.data});
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
