#include "passes/fusion_legality.h"

namespace graphfuse {

FusionDecision CheckMerge(const GroupSummary& a, const GroupSummary& b, const GroupSummary& merged,
                          const FusionOptions& o) {
  if (a.space != b.space)
    return FusionDecision::Refuse(refusal::kShapeMismatch,
                                  StrCat("'", a.name, "' iterates over ", ShapeToString(a.space), ", '", b.name,
                                         "' over ", ShapeToString(b.space)));
  if (a.integer_domain != b.integer_domain)
    return FusionDecision::Refuse(refusal::kDomainMismatch,
                                  StrCat("'", a.name, "' computes in ", a.integer_domain ? "integers" : "floats", ", '",
                                         b.name, "' in ", b.integer_domain ? "integers" : "floats"));
  if (merged.size > o.max_group_size)
    return FusionDecision::Refuse(refusal::kGroupTooLarge, StrCat("'", a.name, "' + '", b.name, "' would hold ",
                                                                  merged.size, " nodes (max_group_size ",
                                                                  o.max_group_size, ")"));
  if (static_cast<int>(merged.reads.size()) > o.max_inputs)
    return FusionDecision::Refuse(refusal::kTooManyInputs, StrCat("'", a.name, "' + '", b.name, "' would read ",
                                                                  merged.reads.size(), " tensors (max_inputs ",
                                                                  o.max_inputs, ")"));
  if (static_cast<int>(merged.writes.size()) > o.max_outputs)
    return FusionDecision::Refuse(refusal::kTooManyOutputs, StrCat("'", a.name, "' + '", b.name, "' would write ",
                                                                   merged.writes.size(), " tensors (max_outputs ",
                                                                   o.max_outputs, ")"));
  return FusionDecision::Allow();
}

namespace {
int64_t Bytes(const std::set<const Value*>& vs) {
  int64_t b = 0;
  for (const Value* v : vs) b += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  return b;
}
}  // namespace

FusionDecision PolicyAllowsMerge(const GroupSummary& a, const GroupSummary& b, const GroupSummary& merged,
                                 const FusionOptions& o, double* saving_us) {
  // Traffic before: each group reads and writes its own tensors; after: the merged group's.
  const int64_t before = Bytes(a.reads) + Bytes(a.writes) + Bytes(b.reads) + Bytes(b.writes);
  const int64_t after = Bytes(merged.reads) + Bytes(merged.writes);
  const double saved =
      o.costs.launch_overhead_us + static_cast<double>(before - after) / (o.costs.bandwidth_gbps * 1e3);
  if (saving_us) *saving_us = saved;
  if (saved <= o.min_saving_us)
    return FusionDecision::Refuse(refusal::kNotProfitable,
                                  StrCat("merging '", a.name, "' and '", b.name, "' saves an estimated ", saved,
                                         " us (min_saving_us ", o.min_saving_us, ")"));
  return FusionDecision::Allow();
}

}  // namespace graphfuse
