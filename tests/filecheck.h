// A small FileCheck for tests: matches a text (printed IR) against CHECK directives.
//
//   CHECK: x        x appears after the end of the previous match (the same line or later)
//   CHECK-NEXT: x   x appears on the line right after the previous match's line
//   CHECK-SAME: x   x appears further on the previous match's line
//   CHECK-NOT: x    x appears nowhere between the previous match and the next one (or the
//                   text's end when no positive directive follows)
//   CHECK-LABEL: x  as CHECK (kept for readers used to LLVM's FileCheck)
//
// A directive may sit anywhere on its line ("// CHECK: ..." or "# CHECK: ..."); lines without
// one are ignored. A pattern is literal text, trimmed, where a run of spaces matches any run
// of spaces or tabs, and {{re}} is an ECMAScript regular expression (std::regex); the regex
// ends at the first "}}" not followed by another '}', so {{[0-9a-f]{8}}} reads [0-9a-f]{8}.
// Patterns match within one line.
#pragma once

#include <string_view>

#include "graphfuse/status.h"

namespace graphfuse::testing {

// Ok when `text` satisfies every directive of `checks`. Otherwise an error whose message shows
// the directive that failed, its line in `checks`, and the lines of `text` that were searched
// (numbered, the search's start marked); malformed checks (no directive, an unknown one, an
// empty pattern, a bad regex, CHECK-NEXT / CHECK-SAME first) are errors too.
Status FileCheck(std::string_view text, std::string_view checks);

}  // namespace graphfuse::testing
