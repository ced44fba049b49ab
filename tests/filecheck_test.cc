// The FileCheck matcher of the pass tests (filecheck.h): what each directive accepts, that each
// one reports a mismatch, what a failure message shows, and malformed checks.
#include "filecheck.h"

#include <gtest/gtest.h>

#include <string>

namespace graphfuse::testing {
namespace {

constexpr const char* kText = R"(graph @g(%x: f32[4]) {
  %0: f32[4] = Neg(%x)
  %1: f32[4] = Exp(%0) {kernel_name = "exp_f32_1a2b3c4d"}
  %2: f32[4] = Add(%0, %1)
  return %2
}
)";

// Expects `checks` to pass on kText.
void ExpectMatch(const std::string& checks) {
  const Status s = FileCheck(kText, checks);
  EXPECT_TRUE(s.ok()) << "checks:\n" << checks << "\n" << s.message();
}

// Expects `checks` to fail on kText, with a message holding each of `parts`.
void ExpectMismatch(const std::string& checks, const std::vector<std::string>& parts) {
  const Status s = FileCheck(kText, checks);
  ASSERT_FALSE(s.ok()) << "checks:\n" << checks;
  for (const std::string& p : parts)
    EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' in:\n" << s.message();
}

TEST(FileCheck, CheckMatchesInOrder) {
  ExpectMatch(R"(
CHECK: graph @g(%x: f32[4]) {
CHECK: Neg(%x)
CHECK: Add(%0, %1)
CHECK: return %2
)");
  // Later on the line of the previous match.
  ExpectMatch("CHECK: %1: f32[4]\nCHECK: Exp(%0)");
  // Lines without a directive are ignored; a directive may follow a comment marker.
  ExpectMatch("the text of a graph\n// CHECK: Neg(\n# CHECK: Exp(\n   CHECK: Add(");
}

TEST(FileCheck, CheckFailsWhenMissingOrOutOfOrder) {
  ExpectMismatch("CHECK: Mul(",
                 {"CHECK: Mul( (checks line 1)", "no match from line 1, column 1", "(no previous match)"});
  // Exp comes before Add: searched only after the Add.
  ExpectMismatch("CHECK: Add(\n\nCHECK: Exp(",
                 {"CHECK: Exp( (checks line 3)", "from line 4, column",
                  "previous match: CHECK: Add( (checks line 1) on text line 4"});
}

TEST(FileCheck, NextMatchesOnlyTheFollowingLine) {
  ExpectMatch("CHECK: Neg(\nCHECK-NEXT: Exp(\nCHECK-NEXT: Add(\nCHECK-NEXT: return");
  ExpectMismatch("CHECK: Neg(\nCHECK-NEXT: Add(",
                 {"CHECK-NEXT: Add( (checks line 2)", "not on text line 3", "it appears on text line 4"});
  ExpectMismatch("CHECK: Neg(\nCHECK-NEXT: Neg(", {"not on text line 3"});
  // Nothing follows the last line.
  ExpectMatch("CHECK: return %2\nCHECK-NEXT: }");
  ExpectMismatch("CHECK: return %2\nCHECK-NEXT: }\nCHECK-NEXT: }", {"the previous match is on the text's last line"});
}

TEST(FileCheck, SameMatchesFurtherOnTheLine) {
  ExpectMatch("CHECK: %1: f32[4] = Exp(\nCHECK-SAME: kernel_name = \nCHECK-SAME: }");
  // On the next line, not this one.
  ExpectMismatch("CHECK: Neg(\nCHECK-SAME: Exp(",
                 {"CHECK-SAME: Exp( (checks line 2)", "not on text line 2", "it appears on text line 3"});
  // Before the previous match on its line.
  ExpectMismatch("CHECK: Exp(\nCHECK-SAME: %1:", {"not on text line 3 after column"});
}

TEST(FileCheck, NotChecksOnlyBetweenTheSurroundingMatches) {
  ExpectMatch("CHECK-NOT: Mul(\nCHECK: Neg(\nCHECK-NOT: Add(\nCHECK: Exp(\nCHECK-NOT: Neg(");
  // Neg appears before the first match; only the region after it counts.
  ExpectMatch("CHECK: Exp(\nCHECK-NOT: Neg(");
  ExpectMismatch("CHECK: Neg(\nCHECK-NOT: Exp(\nCHECK: Add(",
                 {"CHECK-NOT: Exp( (checks line 2)", "found on text line 3", "between line 2, column",
                  "and line 4, column"});
  // At the start: the region begins at the text's start.
  ExpectMismatch("CHECK-NOT: graph\nCHECK: Neg(", {"CHECK-NOT: graph (checks line 1)", "found on text line 1"});
  // At the end: the region runs to the text's end.
  ExpectMismatch("CHECK: Neg(\nCHECK-NOT: return", {"found on text line 5"});
  // The same line as the previous match, after it.
  ExpectMismatch("CHECK: Exp(\nCHECK-NOT: kernel_name", {"found on text line 3"});
}

TEST(FileCheck, LabelActsAsCheck) {
  ExpectMatch("CHECK-LABEL: graph @g\nCHECK: Neg(");
  ExpectMismatch("CHECK-LABEL: graph @h", {"CHECK-LABEL: graph @h (checks line 1)", "no match"});
}

TEST(FileCheck, RegexSegmentsAndLiterals) {
  ExpectMatch(R"(CHECK: kernel_name = "exp_f32_{{[0-9a-f]{8}}}"}
CHECK: %{{[0-9]+}}: f32[4] = Add(%0, %1))");
  // Outside {{ }} everything is literal: '.', '[', '(' and '*' match themselves only.
  ExpectMismatch("CHECK: f32.4.", {"no match"});
  ExpectMismatch("CHECK: Neg(.*)", {"no match"});
  ExpectMismatch(R"(CHECK: kernel_name = "exp_f32_{{[0-9]{8}}}")", {"no match"});
  // A run of blanks matches any run of blanks.
  ExpectMatch("CHECK: %0:    f32[4]   =   Neg(%x)");
  ExpectMismatch("CHECK: %0:f32[4]", {"no match"});
}

TEST(FileCheck, FailureShowsTheDirectiveAndTheTextSearched) {
  const Status s = FileCheck(kText, "CHECK: Exp(\nCHECK-NOT: Add(\nCHECK: return");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "CHECK-NOT: Add( (checks line 2): found on text line 4, column 16, between line 3, column 20 and line 5, "
            "column 3 (previous match: CHECK: Exp( (checks line 1) on text line 3)\n"
            "text searched:\n"
            "     3 |   %1: f32[4] = Exp(%0) {kernel_name = \"exp_f32_1a2b3c4d\"}\n"
            ">    4 |   %2: f32[4] = Add(%0, %1)\n"
            "     5 |   return %2\n");
}

TEST(FileCheck, NextFailureShowsBothLines) {
  const Status s = FileCheck(kText, "CHECK: Neg(\nCHECK-NEXT: return");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "CHECK-NEXT: return (checks line 2): not on text line 3, the line after the previous match; it appears on "
            "text line 5, column 3 (previous match: CHECK: Neg( (checks line 1) on text line 2)\n"
            "text searched:\n"
            "     2 |   %0: f32[4] = Neg(%x)\n"
            ">    3 |   %1: f32[4] = Exp(%0) {kernel_name = \"exp_f32_1a2b3c4d\"}\n");
}

TEST(FileCheck, MalformedChecksAreErrors) {
  auto error = [](const std::string& checks) {
    const Status s = FileCheck(kText, checks);
    EXPECT_FALSE(s.ok()) << checks;
    return s.message();
  };
  EXPECT_NE(error("no directives here").find("no CHECK directive"), std::string::npos);
  EXPECT_NE(error("CHECK: Neg(\nCHECK-NXT: Exp(").find("checks line 2: unknown directive"), std::string::npos);
  EXPECT_NE(error("CHECK:   ").find("CHECK without a pattern"), std::string::npos);
  EXPECT_NE(error("CHECK-NEXT: Neg(").find("needs a CHECK before it"), std::string::npos);
  EXPECT_NE(error("CHECK-NOT: x\nCHECK-SAME: Neg(").find("needs a CHECK before it"), std::string::npos);
  EXPECT_NE(error("CHECK: {{[}}").find("bad regex"), std::string::npos);
  EXPECT_NE(error("CHECK: {{abc").find("'{{' without '}}'"), std::string::npos);
}

TEST(FileCheck, EmptyText) {
  EXPECT_TRUE(FileCheck("", "CHECK-NOT: x").ok());
  const Status s = FileCheck("", "CHECK: x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("(the text is empty)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace graphfuse::testing
