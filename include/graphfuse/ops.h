// The elementwise operator library: op kinds, their static description, type and shape rules.
// Every op is one row of include/graphfuse/ops.def; this header only exposes what the rows say.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "graphfuse/dtype.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse {

enum class OpKind : uint16_t {
#define OP(name, ...) k##name,
#include "ops.def"
#undef OP
};

enum class OpClass : uint8_t { kArith, kActivation, kCompare, kLogical, kSelect, kCast, kRandom };

// Scalar attributes. alpha/beta mean what each op's row says (LeakyRelu slope, Clip bounds,
// Scale factor, Dropout ratio p, HardSigmoid alpha/beta, Elu alpha); DefaultAttrs fills them.
struct OpAttrs {
  float alpha = 0.f;
  float beta = 0.f;
  DType to = DType::kF32;  // Cast target
  uint64_t seed = 0;       // Dropout: the RNG key; element i's mask depends only on (seed, i)
  bool training = false;   // Dropout: false = identity (inference)
};

struct OpInfo {
  OpKind kind;
  const char* name;
  int arity;
  OpClass cls;
  bool int_ok;      // also defined on i32/i64/bool data
  int cost;         // relative compute cost per element (add = 1)
  int max_ulp;      // f32 accuracy contract against the float64 reference
  float default_alpha;
  float default_beta;
  const char* expr;  // the row's expression, as written in ops.def
};

std::span<const OpInfo> AllOps();
const OpInfo& GetOpInfo(OpKind kind);
inline const char* OpName(OpKind kind) { return GetOpInfo(kind).name; }
// Case-sensitive lookup by the table's name ("Add", "Gelu", ...).
Result<OpKind> OpFromName(std::string_view name);
OpAttrs DefaultAttrs(OpKind kind);

// Type rule: arithmetic and activations keep their (common) input dtype; comparisons give
// bool; logical ops take and give bool; Where takes a bool condition; Cast gives attrs.to.
// Errors name the op and every input dtype.
Result<DType> InferDType(OpKind kind, std::span<const DType> inputs, const OpAttrs& attrs);
// Shape rule: multidirectional broadcasting; Bias requires a 1-D bias matching the last dim.
Result<Shape> InferShape(OpKind kind, std::span<const Shape> inputs);
// Attribute ranges (Dropout ratio in [0, 1), Clip min <= max, ...).
Status CheckAttrs(OpKind kind, const OpAttrs& attrs);

}  // namespace graphfuse
