// Pieces of the CUDA code generator shared by its kernel families (codegen.cc: elementwise
// groups; codegen_rows.cc: norms, softmax, RoPE and GEMM epilogues; codegen_attention.cc:
// FusedAttention's forms). Not a public interface.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/codegen.h"
#include "graphfuse/graph.h"
#include "graphfuse/ops.h"

namespace graphfuse::cuda::internal {

// `template <class T> T op_<Name>(T x, T y, T z, const Attrs& a, long long idx)`: one op-table
// row's expression, stringized from include/graphfuse/ops.def.
std::string RowFunction(OpKind kind);
// The rows marked in `used` (indexed by OpKind), in table order, with a heading comment.
std::string RowFunctions(const std::vector<bool>& used);
size_t NumRows();

// A float literal that reads back to the same float (inf / NaN as bit patterns).
std::string FloatLiteral(float f);
// The C type a dtype is stored as in device memory ("float", "gf::f16", ...).
const char* StorageType(DType t);
// Text safe inside a // comment.
std::string CommentSafe(const std::string& s);
// "add_mul_add" from a body's first six ops.
std::string OpsPart(const Graph& body);

// The sizes a kernel takes at run time. Its last parameter, `const gf::Sizes<N> z`, holds them
// (CudaKernelSource::sizes), and its source names each one as a local declared from z, never by
// its value: one source serves every size of a shape class, so a new sequence length compiles
// nothing. What stays in the source is what the sizes' pattern fixes (rank, which dims
// broadcast) and what the weights fix where a generator says so.
class KernelSizes {
 public:
  // The local `name` of C type `type` ("long long" or "unsigned") holding `value`. A name used
  // again is the same size: its value must agree.
  std::string Use(const std::string& name, int64_t value, const char* type = "long long");
  // ", const gf::Sizes<N> z" for the end of the parameter list; empty without sizes.
  std::string Parameter() const;
  // The locals, one declaration a line.
  std::string Declarations(const std::string& indent) const;
  // The values, in z's order.
  std::vector<int64_t> values() const;

 private:
  struct Entry {
    std::string name, type;
    int64_t value;
  };
  std::vector<Entry> entries_;
};

// The collapsed iteration space and every input's strides over it (0 = broadcast).
struct Space {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;  // per input, one per dim
  int64_t numel = 1;

  bool IsScalar(size_t k) const {
    return std::all_of(strides[k].begin(), strides[k].end(), [](int64_t s) { return s == 0; });
  }
  bool IsDense(size_t k) const {
    int64_t inner = 1;
    for (size_t d = dims.size(); d-- > 0;) {
      if (strides[k][d] != inner) return false;
      inner *= dims[d];
    }
    return true;
  }
  // Offsets fit 32 bits: index arithmetic (/ and %) in unsigned int, which is several times
  // cheaper on the GPU than in 64 bits. A guard on the size, not the size itself.
  bool Small() const { return numel <= (int64_t{1} << 31); }
  // The element offset of input k at flat index `i64`, as a C expression over sizes taken at
  // run time (named with `tag` first, so that two spaces of one kernel keep theirs apart). The
  // expression's form follows the pattern: which dims input k broadcasts along, which of its
  // strides are 1, which dims are innermost.
  std::string Offset(size_t k, const std::string& i64, KernelSizes& z, const std::string& tag = "") const {
    if (IsScalar(k)) return "0";
    if (IsDense(k)) return i64;
    const std::string i = Small() ? StrCat("static_cast<unsigned>(", i64, ")") : i64;
    const char* type = Small() ? "unsigned" : "long long";
    std::string expr;
    int64_t inner = 1;
    std::vector<std::string> terms;
    for (size_t d = dims.size(); d-- > 0;) {
      const int64_t s = strides[k][d];
      if (s != 0) {
        std::string t = d + 1 == dims.size() ? i : StrCat("(", i, " / ", z.Use(StrCat(tag, "inner", d), inner, type), ")");
        if (d != 0) t = StrCat("(", t, " % ", z.Use(StrCat(tag, "dim", d), dims[d], type), ")");
        if (s != 1) t = StrCat(t, " * ", z.Use(StrCat(tag, "stride", k, "_", d), s, type));
        terms.push_back(t);
      }
      inner *= dims[d];
    }
    for (auto it = terms.rbegin(); it != terms.rend(); ++it) expr += (expr.empty() ? "" : " + ") + *it;
    return expr;
  }
};

// Collapses `out` with the inputs' broadcast strides; an input k with row_strides[k] > 0 has
// out's shape laid out as rows of row_strides[k] elements (a column block of a wider matrix).
Space Collapse(const Shape& out, const std::vector<Shape>& ins, const std::vector<int64_t>& row_strides = {});

// `__forceinline__ void <fn>(long long idx, T r0.., T& o0..)`: one element of an elementwise
// body (inputs in body order, then outputs), f16/bf16 intermediates rounded as the unfused
// ops store them. Marks the op rows it calls in `used`.
struct BodyFunction {
  std::string code;
  bool ints = false;  // computes in long long (integer data) instead of float
};
Result<BodyFunction> EmitBodyFunction(const Graph& body, const std::string& fn, const std::string& where,
                                      std::vector<bool>& used);

// ---- row kernels and attention (codegen_rows.cc) ----

// Block reductions (gf::block_sum in double, gf::block_max) for kernels of kCudaBlockSize
// threads, placed inside namespace gf after the op rows.
extern const char* const kRowPrelude;
// Float data of any dtype: loaded into f32, computed in f32 (sums in double), rounded once when
// stored. For f32 these give the plain C text (no conversion calls), for f16 / bf16 the
// prelude's conversions.
// The element `ref` (of dtype dt) as a float.
std::string LoadF32(DType dt, const std::string& ref);
// The statement storing float `value` at base[off] (of dtype dt).
std::string StoreTo(DType dt, const std::string& base, const std::string& off, const std::string& value);
// Float `value` rounded to dt's precision, as storing it to dt and loading it back would.
std::string RoundedTo(DType dt, const std::string& value);
// Names the kernel "<base>_<dtype>_<hash8>", the hash over the source without the name.
CudaKernelSource Finish(const std::string& head, const std::string& tail, const std::string& base, DType dt,
                        CudaKernelSource k);

}  // namespace graphfuse::cuda::internal
