// An op's identity. Every op the IR knows (the op table's rows, include/graphfuse/ops.def, then
// the ops the registry's schemas add, op_names.def) is one enumerator of op::Id, so a pass asks
// `node.is(op::MatMul)` and compares two integers, not two names; a misspelt op does not
// compile. A node whose op the IR does not know (the importer refuses those; a test may still
// build one) has op::kUnknown.
#pragma once

#include <cstdint>
#include <string_view>

#include "graphfuse/ops.h"

namespace graphfuse::op {

enum Id : uint16_t {
#define OP(name, ...) name,
#include "graphfuse/ops.def"
#undef OP
#define GF_IR_OP(name) name,
#include "graphfuse/op_names.def"
#undef GF_IR_OP
  kUnknown,
};

// The op table's rows come first, in the table's order: an id below this is an elementwise op
// whose OpKind has the same number.
inline constexpr int kTableRows = 0
#define OP(name, ...) +1
#include "graphfuse/ops.def"
#undef OP
    ;
inline constexpr int kCount = kUnknown;

// The id of the op named `name` (case-sensitive); kUnknown for a name no op has.
Id FromName(std::string_view name);
// "MatMul"; "?" for kUnknown.
const char* Name(Id id);
// Whether `id` is a row of the op table, and its kind there.
inline bool IsTableRow(Id id) { return id < kTableRows; }
inline OpKind ToOpKind(Id id) { return static_cast<OpKind>(id); }
inline Id FromOpKind(OpKind kind) { return static_cast<Id>(kind); }
// Whether `id` is one of the fused ops (op_names.def lists them last, FusedElementwise first).
inline bool IsFused(Id id) { return id >= FusedElementwise && id < kUnknown; }

}  // namespace graphfuse::op
