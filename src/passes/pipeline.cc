#include "pipeline.h"

#include "../ir/text.h"
#include "fold_constants.h"

namespace graphfuse {

Result<std::vector<PassRecord>> RunPipeline(Graph& g, const PipelineOptions& options) {
  std::vector<PassRecord> records;
  GF_RETURN_IF_ERROR(g.Verify().WithContext("verifier, before any pass"));
  auto after = [&](const char* pass, Result<int> changes) -> Status {
    if (!changes.ok()) return changes.status().WithContext(pass);
    GF_RETURN_IF_ERROR(g.Verify().WithContext(StrCat("verifier, after ", pass)));
    records.push_back({pass, *changes});
    if (options.print_after_each)
      std::fprintf(options.print_after_each, "// after %s (%d changes)\n%s\n", pass, *changes, PrintGraph(g).c_str());
    return Status::Ok();
  };
  GF_RETURN_IF_ERROR(after("FoldConstants", FoldConstants(g)));
  auto fused = FuseElementwise(g, options.fusion);
  if (fused.ok() && options.fusion_report) *options.fusion_report = *fused;
  GF_RETURN_IF_ERROR(after("FuseElementwise", fused.ok() ? Result<int>(static_cast<int>(fused->groups.size()))
                                                         : Result<int>(fused.status())));
  return records;
}

}  // namespace graphfuse
