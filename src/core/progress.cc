#include "core/progress.h"

#include <mutex>
#include <utility>

namespace graphfuse {
namespace {

struct Sink {
  std::mutex mu;
  std::function<void(std::string_view)> fn;
};
Sink& TheSink() {
  static Sink s;
  return s;
}

}  // namespace

void SetProgressSink(std::function<void(std::string_view line)> sink) {
  Sink& s = TheSink();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fn = std::move(sink);
}

void ReportProgress(std::string_view line) {
  Sink& s = TheSink();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fn) s.fn(line);
}

}  // namespace graphfuse
