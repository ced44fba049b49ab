// Status and Result<T>: how every user-facing error in graphfuse travels.
//
// User errors (bad model, shape mismatch, unsupported op, absurd sizes) come back as a
// Status whose message names the culprit (node, op, shapes). Broken internal invariants
// abort through GF_CHECK instead: they are bugs, not inputs.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace graphfuse {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // malformed input: shapes, dtypes, arity, attribute values
  kUnimplemented,      // valid input that graphfuse does not support (yet)
  kResourceExhausted,  // an allocation that is absurd or failed
  kNotFound,           // a file, op or name that does not exist
  kInternal,           // should not happen; reported rather than crashing
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid-argument: <message>"
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (adds where the error happened).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace detail {
// What StrCat appends without a stream: text, chars and integers (written as a stream writes
// them). Anything else (floats, bools, types with an operator<<) goes through a stream.
template <class T>
inline constexpr bool kCatText = std::is_convertible_v<const T&, std::string_view>;
template <class T>
inline constexpr bool kCatInteger = std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char> &&
                                    !std::is_same_v<T, signed char> && !std::is_same_v<T, unsigned char> &&
                                    !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> &&
                                    !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t>;
template <class T>
void CatAppend(std::string& s, const T& v) {
  if constexpr (std::is_same_v<T, char>) {
    s += v;
  } else if constexpr (kCatText<T>) {
    s += std::string_view(v);
  } else {
    char buf[24];
    s.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
  }
}
}  // namespace detail

// Concatenates any streamable values into one string: StrCat("node ", name, " has ", n). Text
// and integers are appended directly (planning builds many such strings); the rest streamed.
template <class... Args>
std::string StrCat(const Args&... args) {
  if constexpr (((detail::kCatText<Args> || detail::kCatInteger<Args> || std::is_same_v<Args, char>) && ...)) {
    std::string s;
    (detail::CatAppend(s, args), ...);
    return s;
  } else {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  }
}

template <class... Args>
Status InvalidArgument(const Args&... args) {
  return Status(StatusCode::kInvalidArgument, StrCat(args...));
}
template <class... Args>
Status Unimplemented(const Args&... args) {
  return Status(StatusCode::kUnimplemented, StrCat(args...));
}
template <class... Args>
Status ResourceExhausted(const Args&... args) {
  return Status(StatusCode::kResourceExhausted, StrCat(args...));
}
template <class... Args>
Status NotFound(const Args&... args) {
  return Status(StatusCode::kNotFound, StrCat(args...));
}
template <class... Args>
Status Internal(const Args&... args) {
  return Status(StatusCode::kInternal, StrCat(args...));
}

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace internal

}  // namespace graphfuse

#define GF_CONCAT_INNER(a, b) a##b
#define GF_CONCAT(a, b) GF_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define GF_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::graphfuse::Status gf_status_ = (expr);           \
    if (!gf_status_.ok()) return gf_status_;           \
  } while (0)

// `GF_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define GF_ASSIGN_OR_RETURN(lhs, expr) GF_ASSIGN_OR_RETURN_IMPL(GF_CONCAT(gf_result_, __LINE__), lhs, expr)
#define GF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

// Internal invariant: aborts with file:line. Never used for user input.
#define GF_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) ::graphfuse::internal::CheckFailed(__FILE__, __LINE__, #cond,                \
                                                    ::graphfuse::StrCat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
