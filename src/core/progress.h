// The library's side of graphfuse/progress.h: a line for the sink, if one is set.
#pragma once

#include <string_view>

#include "graphfuse/progress.h"

namespace graphfuse {

void ReportProgress(std::string_view line);

}  // namespace graphfuse
