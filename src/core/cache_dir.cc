#include "core/cache_dir.h"

#include <cstdlib>

namespace graphfuse {

std::filesystem::path UserCacheDir(std::string_view sub) {
  if (const char* d = std::getenv("GF_KERNEL_CACHE"); d && *d) return std::filesystem::path(d) / sub;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::filesystem::path(d) / "graphfuse" / sub;
  if (const char* d = std::getenv("HOME"); d && *d) return std::filesystem::path(d) / ".cache" / "graphfuse" / sub;
  return std::filesystem::temp_directory_path() / "graphfuse" / sub;
}

}  // namespace graphfuse
