#include "filecheck.h"

#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace graphfuse::testing {
namespace {

enum class Kind { kCheck, kNext, kSame, kNot, kLabel };

struct Directive {
  Kind kind;
  std::string pattern;  // as written, trimmed
  int line;             // 1-based, in the checks
  std::regex re;
};

// A place in the text: 0-based line and column.
struct Pos {
  size_t line = 0, col = 0;
};

// Where a pattern matched: [begin, end) on `line`.
struct Match {
  size_t line, begin, end;
};

// Longest names first, so that "CHECK-NEXT:" is not read as "CHECK" followed by "-NEXT:".
constexpr struct {
  const char* suffix;
  Kind kind;
} kDirectives[] = {{"-LABEL:", Kind::kLabel}, {"-NEXT:", Kind::kNext}, {"-SAME:", Kind::kSame},
                   {"-NOT:", Kind::kNot},     {":", Kind::kCheck}};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kCheck: return "CHECK";
    case Kind::kNext: return "CHECK-NEXT";
    case Kind::kSame: return "CHECK-SAME";
    case Kind::kNot: return "CHECK-NOT";
    case Kind::kLabel: return "CHECK-LABEL";
  }
  return "?";
}

std::string Describe(const Directive& d) {
  return StrCat(KindName(d.kind), ": ", d.pattern, " (checks line ", d.line, ")");
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) nl = s.size();
    lines.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

// The pattern as a regex: literal text escaped, runs of blanks as [ \t]+, {{re}} as (?:re).
Result<std::regex> Compile(const std::string& p, int line) {
  std::string re;
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, 2, "{{") == 0) {
      size_t end = p.find("}}", i + 2);
      if (end == std::string::npos) return InvalidArgument("checks line ", line, ": '{{' without '}}' in: ", p);
      while (end + 2 < p.size() && p[end + 2] == '}') ++end;
      re += "(?:" + p.substr(i + 2, end - i - 2) + ")";
      i = end + 2;
    } else if (p[i] == ' ' || p[i] == '\t') {
      while (i < p.size() && (p[i] == ' ' || p[i] == '\t')) ++i;
      re += "[ \\t]+";
    } else {
      if (std::strchr("\\^$.*+?()[]{}|", p[i])) re += '\\';
      re += p[i++];
    }
  }
  try {
    return std::regex(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidArgument("checks line ", line, ": bad regex in '", p, "': ", e.what());
  }
}

Result<std::vector<Directive>> ParseChecks(std::string_view checks) {
  std::vector<Directive> out;
  const std::vector<std::string> lines = SplitLines(checks);
  for (size_t i = 0; i < lines.size(); ++i) {
    const int n = static_cast<int>(i) + 1;
    const std::string& l = lines[i];
    const size_t at = l.find("CHECK");
    if (at == std::string::npos) continue;
    std::optional<Kind> kind;
    size_t rest = 0;
    for (const auto& d : kDirectives)
      if (l.compare(at + 5, std::strlen(d.suffix), d.suffix) == 0) {
        kind = d.kind;
        rest = at + 5 + std::strlen(d.suffix);
        break;
      }
    if (!kind) return InvalidArgument("checks line ", n, ": unknown directive in: ", Trim(l));
    std::string pattern = Trim(std::string_view(l).substr(rest));
    if (pattern.empty()) return InvalidArgument("checks line ", n, ": ", KindName(*kind), " without a pattern");
    const bool needs_previous = *kind == Kind::kNext || *kind == Kind::kSame;
    bool has_previous = false;
    for (const Directive& d : out) has_previous |= d.kind != Kind::kNot;
    if (needs_previous && !has_previous)
      return InvalidArgument("checks line ", n, ": ", KindName(*kind), " needs a CHECK before it");
    GF_ASSIGN_OR_RETURN(std::regex re, Compile(pattern, n));
    out.push_back({*kind, std::move(pattern), n, std::move(re)});
  }
  if (out.empty()) return InvalidArgument("the checks hold no CHECK directive");
  return out;
}

class Checker {
 public:
  explicit Checker(std::string_view text) : lines_(SplitLines(text)) {}

  Status Run(const std::vector<Directive>& directives) {
    std::vector<const Directive*> nots;  // waiting for the next positive match to bound them
    for (const Directive& d : directives) {
      if (d.kind == Kind::kNot) {
        nots.push_back(&d);
        continue;
      }
      std::optional<Match> m;
      switch (d.kind) {
        case Kind::kCheck:
        case Kind::kLabel: m = SearchFrom(d.re, cur_); break;
        case Kind::kNext:
          if (prev_->line + 1 < lines_.size()) m = SearchLine(d.re, prev_->line + 1, 0, lines_[prev_->line + 1].size());
          break;
        case Kind::kSame: m = SearchLine(d.re, prev_->line, prev_->end, lines_[prev_->line].size()); break;
        case Kind::kNot: break;
      }
      if (!m) return NotFound(d);
      GF_RETURN_IF_ERROR(CheckNots(nots, Pos{m->line, m->begin}));
      nots.clear();
      prev_ = m;
      prev_directive_ = &d;
      cur_ = Pos{m->line, m->end};
    }
    return CheckNots(nots, End());
  }

 private:
  Pos End() const { return lines_.empty() ? Pos{} : Pos{lines_.size() - 1, lines_.back().size()}; }

  // The first match of `re` in line `line` within columns [from, to).
  std::optional<Match> SearchLine(const std::regex& re, size_t line, size_t from, size_t to) const {
    const std::string& l = lines_[line];
    if (from > to || to > l.size()) return std::nullopt;
    auto flags = std::regex_constants::match_default;
    if (from > 0) flags |= std::regex_constants::match_prev_avail;
    if (to < l.size()) flags |= std::regex_constants::match_not_eol;
    std::smatch m;
    const auto begin = l.begin() + static_cast<std::ptrdiff_t>(from), end = l.begin() + static_cast<std::ptrdiff_t>(to);
    if (!std::regex_search(begin, end, m, re, flags)) return std::nullopt;
    const size_t b = from + static_cast<size_t>(m.position(0));
    return Match{line, b, b + static_cast<size_t>(m.length(0))};
  }

  // The first match at or after `from`, up to the end of the text.
  std::optional<Match> SearchFrom(const std::regex& re, Pos from) const {
    for (size_t l = from.line; l < lines_.size(); ++l)
      if (auto m = SearchLine(re, l, l == from.line ? from.col : 0, lines_[l].size())) return m;
    return std::nullopt;
  }

  // Each CHECK-NOT of `nots` must not match in [cur_, to).
  Status CheckNots(const std::vector<const Directive*>& nots, Pos to) const {
    for (const Directive* d : nots) {
      for (size_t l = cur_.line; l < lines_.size() && l <= to.line; ++l) {
        const size_t from = l == cur_.line ? cur_.col : 0;
        const size_t end = l == to.line ? to.col : lines_[l].size();
        if (auto m = SearchLine(d->re, l, from, end)) {
          return InvalidArgument(Describe(*d), ": found on text line ", l + 1, ", column ", m->begin + 1, ", between ",
                                 Where(cur_), " and ", Where(to), PreviousMatch(), "\ntext searched:\n",
                                 Region(cur_.line, to.line, l));
        }
      }
    }
    return Status::Ok();
  }

  Status NotFound(const Directive& d) const {
    if (d.kind == Kind::kCheck || d.kind == Kind::kLabel) {
      const size_t last = lines_.empty() ? 0 : lines_.size() - 1;
      return InvalidArgument(Describe(d), ": no match from ", Where(cur_), " to the end of the text", PreviousMatch(),
                             "\ntext searched:\n", Region(cur_.line, last, cur_.line));
    }
    // CHECK-NEXT / CHECK-SAME: say where the pattern does appear, if anywhere later.
    const std::optional<Match> later = SearchFrom(d.re, cur_);
    const std::string elsewhere =
        later ? StrCat("; it appears on text line ", later->line + 1, ", column ", later->begin + 1) : "";
    if (d.kind == Kind::kSame) {
      return InvalidArgument(Describe(d), ": not on text line ", prev_->line + 1, " after column ", prev_->end + 1,
                             elsewhere, PreviousMatch(), "\ntext searched:\n",
                             Region(prev_->line, prev_->line, prev_->line));
    }
    if (prev_->line + 1 >= lines_.size()) {
      return InvalidArgument(Describe(d), ": the previous match is on the text's last line", PreviousMatch(),
                             "\ntext searched:\n", Region(prev_->line, prev_->line, prev_->line));
    }
    return InvalidArgument(Describe(d), ": not on text line ", prev_->line + 2, ", the line after the previous match",
                           elsewhere, PreviousMatch(), "\ntext searched:\n",
                           Region(prev_->line, prev_->line + 1, prev_->line + 1));
  }

  static std::string Where(Pos p) { return StrCat("line ", p.line + 1, ", column ", p.col + 1); }

  std::string PreviousMatch() const {
    if (!prev_) return " (no previous match)";
    return StrCat(" (previous match: ", Describe(*prev_directive_), " on text line ", prev_->line + 1, ")");
  }

  // Text lines [first, last], numbered from 1, `marked` flagged with '>'; long regions are cut.
  std::string Region(size_t first, size_t last, size_t marked) const {
    if (lines_.empty()) return "  (the text is empty)\n";
    constexpr size_t kMaxLines = 60;
    std::string s;
    if (marked >= first + kMaxLines) {  // keep the marked line in view
      const size_t skip = marked - kMaxLines / 2 - first;
      s += StrCat("  ... ", skip, " lines\n");
      first += skip;
    }
    for (size_t l = first; l <= last && l < lines_.size(); ++l) {
      if (l - first == kMaxLines) {
        s += StrCat("  ... ", last - l + 1, " more lines\n");
        break;
      }
      char num[32];
      std::snprintf(num, sizeof num, "%c %4zu | ", l == marked ? '>' : ' ', l + 1);
      s += num + lines_[l] + "\n";
    }
    return s;
  }

  std::vector<std::string> lines_;
  Pos cur_;                     // where the next CHECK starts searching
  std::optional<Match> prev_;   // the last positive match
  const Directive* prev_directive_ = nullptr;
};

}  // namespace

Status FileCheck(std::string_view text, std::string_view checks) {
  GF_ASSIGN_OR_RETURN(std::vector<Directive> directives, ParseChecks(checks));
  return Checker(text).Run(directives);
}

}  // namespace graphfuse::testing
