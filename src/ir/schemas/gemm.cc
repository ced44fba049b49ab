// MatMul (numpy matmul semantics: batched broadcasting, 1-D operands) and Gemm (alpha, beta,
// transA, transB, C broadcast): shapes and inference.
#include "ir/schemas/gemm.h"

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

Result<MatMulDims> MatMulShapes(const Shape& a_in, const Shape& b_in, const std::string& where) {
  if (a_in.empty() || b_in.empty())
    return InvalidArgument(where, ": MatMul operands must have rank >= 1 (numpy matmul), got ",
                           ShapeToString(a_in), " and ", ShapeToString(b_in));
  MatMulDims d;
  d.a = a_in.size() == 1 ? Shape{1, a_in[0]} : a_in;
  d.b = b_in.size() == 1 ? Shape{b_in[0], 1} : b_in;
  d.m = d.a[d.a.size() - 2];
  d.k = d.a.back();
  d.n = d.b.back();
  const int64_t kb = d.b[d.b.size() - 2];
  if (d.k != kb)
    return InvalidArgument(where, ": inner dimensions differ: A ", ShapeToString(a_in), " has K=", d.k, " but B ",
                           ShapeToString(b_in), " has K=", kb);
  const Shape batches[2] = {Shape(d.a.begin(), d.a.end() - 2), Shape(d.b.begin(), d.b.end() - 2)};
  auto batch = BroadcastShapes(batches);
  if (!batch.ok())
    return InvalidArgument(where, ": batch dimensions of A ", ShapeToString(a_in), " and B ", ShapeToString(b_in),
                           " do not broadcast: ", batch.status().message());
  d.batch = *batch;
  d.out = d.batch;
  if (a_in.size() > 1) d.out.push_back(d.m);
  if (b_in.size() > 1) d.out.push_back(d.n);
  return d;
}

Result<GemmDims> GemmShapes(const Shape& a, const Shape& b, const Shape* c, bool ta, bool tb,
                            const std::string& where) {
  if (a.size() != 2 || b.size() != 2)
    return InvalidArgument(where, ": Gemm needs 2-D A and B, got ", ShapeToString(a), " and ", ShapeToString(b));
  GemmDims d{ta ? a[1] : a[0], ta ? a[0] : a[1], tb ? b[0] : b[1]};
  const int64_t kb = tb ? b[1] : b[0];
  if (d.k != kb)
    return InvalidArgument(where, ": inner dimensions differ: op(A) of A ", ShapeToString(a), " (transA=", ta,
                           ") has K=", d.k, " but op(B) of B ", ShapeToString(b), " (transB=", tb, ") has K=", kb);
  if (c != nullptr) {
    bool ok = c->size() <= 2;
    const Shape mn = {d.m, d.n};
    for (size_t i = 0; ok && i < c->size(); ++i) {
      const int64_t cd = (*c)[c->size() - 1 - i], od = mn[1 - i];
      ok = cd == od || cd == 1;
    }
    if (!ok)
      return InvalidArgument(where, ": C ", ShapeToString(*c), " does not broadcast to the output ",
                             ShapeToString(mn));
  }
  return d;
}

namespace {

Result<std::vector<ValueType>> InferMatMul(const InferContext& ctx) {
  const Value* a = ctx.input(0);
  const Value* b = ctx.input(1);
  if (a->dtype() != b->dtype() || a->dtype() == DType::kBool)
    return InvalidArgument(ctx.Describe(), ": MatMul needs two inputs of the same numeric dtype");
  GF_ASSIGN_OR_RETURN(MatMulDims d, MatMulShapes(a->shape(), b->shape(), ctx.Describe()));
  return std::vector<ValueType>{{a->dtype(), d.out}};
}

Result<std::vector<ValueType>> InferGemm(const InferContext& ctx) {
  const Value* a = ctx.input(0);
  const Value* b = ctx.input(1);
  const Value* c = ctx.input(2);
  if (a->dtype() != b->dtype() || (c && c->dtype() != a->dtype()) || a->dtype() == DType::kBool)
    return InvalidArgument(ctx.Describe(), ": Gemm needs inputs of one numeric dtype");
  GF_ASSIGN_OR_RETURN(GemmDims d, GemmShapes(a->shape(), b->shape(), c ? &c->shape() : nullptr,
                                             ctx.GetInt("transA", 0) != 0, ctx.GetInt("transB", 0) != 0,
                                             ctx.Describe()));
  return std::vector<ValueType>{{a->dtype(), Shape{d.m, d.n}}};
}

}  // namespace

std::vector<OpSchema> GemmSchemas() {
  return {
      {"MatMul", 2, 2, 1, InferMatMul},
      {"Gemm", 2, 3, 1, InferGemm},
  };
}

}  // namespace graphfuse::schemas
