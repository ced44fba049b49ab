// Where graphfuse keeps what it caches on disk per user (compiled CPU loops, measured GEMM
// engine choices): $GF_KERNEL_CACHE/<sub>, else $XDG_CACHE_HOME/graphfuse/<sub>, else
// ~/.cache/graphfuse/<sub>, else the temporary directory's graphfuse/<sub>.
#pragma once

#include <filesystem>
#include <string_view>

namespace graphfuse {

std::filesystem::path UserCacheDir(std::string_view sub);

}  // namespace graphfuse
