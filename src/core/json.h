// A minimal streaming JSON writer (objects, arrays, numbers, strings): the tools' --json reports
// and the Chrome-trace profiles (graphfuse/profiling.h).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace graphfuse {

class Json {
 public:
  Json& BeginObject() { return Open('{'); }
  Json& EndObject() { return Close('}'); }
  Json& BeginArray() { return Open('['); }
  Json& EndArray() { return Close(']'); }
  Json& Key(const std::string& k) {
    Separate();
    Quote(k);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  Json& Str(const std::string& s) {
    Separate();
    Quote(s);
    return *this;
  }
  Json& Num(double v) {
    Separate();
    if (!std::isfinite(v)) {
      out_ += "null";  // JSON has no inf/NaN
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.9g", v);
      out_ += buf;
    }
    return *this;
  }
  Json& Int(int64_t v) {
    Separate();
    out_ += std::to_string(v);
    return *this;
  }
  Json& Bool(bool v) {
    Separate();
    out_ += v ? "true" : "false";
    return *this;
  }
  const std::string& str() const { return out_; }
  // Writes the document to `path`; false when the file cannot be written.
  bool WriteFile(const std::string& path) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    const bool ok = std::fwrite(out_.data(), 1, out_.size(), f) == out_.size() && std::fputc('\n', f) != EOF;
    return std::fclose(f) == 0 && ok;
  }

 private:
  Json& Open(char c) {
    Separate();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  Json& Close(char c) {
    first_.pop_back();
    out_ += c;
    return *this;
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ", ";
      first_.back() = false;
    }
  }
  void Quote(const std::string& s) {
    out_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace graphfuse
