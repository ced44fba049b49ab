#include "core/progress.h"

#include <mutex>
#include <utility>

namespace graphfuse {
namespace {

struct Sink {
  std::mutex mu;       // guards fn
  std::mutex call_mu;  // one line at a time
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
  // The sink is called outside `mu`: a sink that waits (Python's, for the GIL) must not hold up
  // a thread replacing it, nor deadlock a sink that replaces itself.
  Sink& s = TheSink();
  std::function<void(std::string_view)> fn;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    fn = s.fn;
  }
  if (!fn) return;
  std::lock_guard<std::mutex> one_line(s.call_mu);
  fn(line);
}

}  // namespace graphfuse
