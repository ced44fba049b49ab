// libFuzzer target: arbitrary bytes through ImportOnnxBytes (protobuf parse, initializers,
// attributes, op conversions, shape inference of every registered op), then the text printer
// on whatever imports. Any crash, sanitizer report, hang (-timeout) or runaway allocation
// (-rss_limit_mb / -malloc_limit_mb) is a bug: malformed models must come back as a Status.
//
// Built and run by fuzz/run.sh (clang++ -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "ir/text.h"
#include "onnx/import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto g = graphfuse::ImportOnnxBytes(bytes, "fuzz.onnx");
#ifndef GF_FUZZ_NO_PRINT
  if (g.ok()) {
    graphfuse::PrintOptions options;
    options.max_constant_elements = 16;
    const std::string text = graphfuse::PrintGraph(**g, options);
    if (text.empty()) __builtin_trap();  // a graph always prints something
  }
#endif
  if (!g.ok() && g.status().message().empty()) __builtin_trap();  // every error explains itself
  return 0;
}
