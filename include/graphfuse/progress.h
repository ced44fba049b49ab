// Lines about the long steps of compiling a model, for a person watching: today a GEMM shape
// class timed for the first time on this machine (gemm engines, CpuGemmEngine::kAuto), which
// takes about a second per class on large weights. graphfuse itself prints nothing: the
// command-line tool sends them to stderr.
//
//   graphfuse::SetProgressSink([](std::string_view line) { std::fprintf(stderr, "%.*s\n", ...); });
//
// The sink is process-wide and replaces the previous one (which may still get a line already on
// its way); it may be called from any thread that compiles, one line at a time, and is called
// outside the lock that guards it. An empty function, the default, drops them.
#pragma once

#include <functional>
#include <string_view>

namespace graphfuse {

void SetProgressSink(std::function<void(std::string_view line)> sink);

}  // namespace graphfuse
