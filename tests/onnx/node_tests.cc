// The ONNX backend node tests (Debian's libonnx-testdata) through ImportOnnxFile + Execute.
//
// Every /usr/share/libonnx-testdata/data/node/test_*/ directory is found at run time and run
// in a forked child, so that a crash or a hang in one model is recorded as that model's
// failure instead of hiding the others. Outcomes:
//   SKIP  the importer (or the executor) answers Unimplemented: an op, dtype, opset or
//         feature graphfuse does not support; the reason is counted
//   PASS  every output of every data set matches (|out-ref| <= atol + rtol*|ref|; exact for
//         integers and bools; NaN matches NaN)
//   FAIL  anything else: another error, a mismatch, a crash, a timeout
// The summary ("pass N / skip N / fail N", skip reasons, failures) is printed and written to
// $GF_NODE_TESTS_REPORT, else to GF_NODE_TESTS_REPORT_DEFAULT (set by CMake), else to
// ./onnx_node_tests.txt. A failure of a test whose outputs are all f32 fails this test.
//
// Environment (for debugging only): GF_ONNX_NODE_DIR overrides the data directory,
// GF_NODE_TESTS_FILTER runs only directories whose name contains it, GF_NODE_TESTS_INPROCESS=1
// runs without forking (for a debugger).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <onnx/onnx_pb.h>

#include "graphfuse/thread_pool.h"
#include "onnx_test_util.h"

namespace graphfuse::testing {
namespace {

constexpr int kChildTimeoutSeconds = 120;

struct Row {
  std::string name;
  DirResult r;
};

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "PASS";
    case Outcome::kSkip: return "SKIP";
    case Outcome::kFail: return "FAIL";
  }
  return "?";
}

Tolerance TolFor(DType t) {
  if (t == DType::kF32) return {1e-3, 1e-5};
  if (IsFloat(t)) return {1e-2, 1e-3};  // f16 / bf16 storage
  return {0, 0};
}

// Whether the model declares every graph output FLOAT: the tests the f32 assertion covers
// (decided from the file, so that a model the importer wrongly rejects still counts).
bool DeclaresFloat32Outputs(const std::string& dir) {
  std::ifstream f(dir + "/model.onnx", std::ios::binary);
  onnx::ModelProto m;
  if (!f || !m.ParseFromIstream(&f) || m.graph().output_size() == 0) return false;
  for (const auto& o : m.graph().output())
    if (o.type().tensor_type().elem_type() != onnx::TensorProto::FLOAT) return false;
  return true;
}

DirResult RunOne(const std::string& dir, int threads) {
  ThreadPool pool(threads);
  CpuContext ctx{&pool};
  DirResult r = RunOnnxTestDir(dir, ctx, TolFor);
  r.float32 = DeclaresFloat32Outputs(dir);
  return r;
}

// Child -> parent: "<outcome> <float32> <kernels unfused> <kernels fused>\n<reason>".
std::string Encode(const DirResult& r) {
  std::string reason = r.reason.substr(0, 2000);
  return StrCat(static_cast<int>(r.outcome), " ", r.float32 ? 1 : 0, " ", r.kernels_unfused, " ", r.kernels_fused,
                "\n", reason);
}

DirResult Decode(const std::string& s) {
  DirResult r;
  std::istringstream in(s);
  int o = 2, f = 0;
  in >> o >> f >> r.kernels_unfused >> r.kernels_fused;
  r.outcome = static_cast<Outcome>(o);
  r.float32 = f != 0;
  const size_t nl = s.find('\n');
  r.reason = nl == std::string::npos ? "" : s.substr(nl + 1);
  return r;
}

struct Child {
  pid_t pid;
  int fd;
  size_t row;
  std::string buf;
};

// Runs every directory in a forked child, `jobs` at a time.
void RunForked(const std::vector<std::string>& dirs, std::vector<Row>& rows, int jobs, int threads) {
  std::vector<Child> running;
  size_t next = 0;
  auto reap = [&](Child& c) {
    int status = 0;
    waitpid(c.pid, &status, 0);
    close(c.fd);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !c.buf.empty()) {
      rows[c.row].r = Decode(c.buf);
    } else {
      rows[c.row].r.outcome = Outcome::kFail;
      rows[c.row].r.float32 = true;  // unknown: a crash counts against the f32 assertion
      rows[c.row].r.reason = WIFSIGNALED(status)
                                 ? StrCat("crashed: signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                                          WTERMSIG(status) == SIGALRM ? ": timeout" : "", ")")
                                 : StrCat("child exited with status ", WEXITSTATUS(status));
    }
  };
  while (next < dirs.size() || !running.empty()) {
    while (next < dirs.size() && static_cast<int>(running.size()) < jobs) {
      int p[2];
      if (pipe(p) != 0) std::abort();
      std::cout.flush();
      std::cerr.flush();
      const pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        alarm(kChildTimeoutSeconds);
        const std::string msg = Encode(RunOne(dirs[next], threads));
        size_t off = 0;
        while (off < msg.size()) {
          const ssize_t w = write(p[1], msg.data() + off, msg.size() - off);
          if (w <= 0) break;
          off += static_cast<size_t>(w);
        }
        _exit(0);
      }
      close(p[1]);
      running.push_back({pid, p[0], next, {}});
      ++next;
    }
    // Read whatever the children wrote; a child is done at EOF.
    std::vector<pollfd> fds;
    for (const Child& c : running) fds.push_back({c.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), -1);
    for (size_t i = running.size(); i-- > 0;) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char b[4096];
      const ssize_t n = read(running[i].fd, b, sizeof b);
      if (n > 0) {
        running[i].buf.append(b, static_cast<size_t>(n));
        continue;
      }
      reap(running[i]);
      running.erase(running.begin() + static_cast<long>(i));
    }
  }
}

// Groups skip messages: "op not supported: Acos", "opset 11 is not supported", ...
std::string SkipKey(const std::string& reason) {
  static const std::regex op_re(R"(\(([A-Za-z0-9_]+)\): op not supported)");
  static const std::regex opset_re(R"(opset (\d+) is not supported)");
  static const std::regex dtype_re(R"(element type ([A-Z0-9<>]+) is not supported)");
  static const std::regex const_re(R"(op ([A-Za-z0-9_]+) \(inputs [^)]*\): needs a constant ([a-z_ ]+) input)");
  std::smatch m;
  if (std::regex_search(reason, m, const_re))
    return StrCat(m[1].str(), ": ", m[2].str(), " input computed at run time (graphfuse needs it constant)");
  if (std::regex_search(reason, m, op_re)) return StrCat("op not supported: ", m[1].str());
  if (std::regex_search(reason, m, opset_re)) return StrCat("opset ", m[1].str(), " not supported");
  if (std::regex_search(reason, m, dtype_re)) return StrCat("element type ", m[1].str(), " not supported");
  // Otherwise the message without the file, with quoted names blanked.
  std::string s = reason;
  const size_t onnx = s.find("model.onnx: ");
  if (onnx != std::string::npos) s = s.substr(onnx + 12);
  s = std::regex_replace(s, std::regex("'[^']*'"), "'*'");
  return s.substr(0, 160);
}

std::string Summarize(const std::vector<Row>& rows, const std::string& data_dir) {
  std::map<Outcome, int> count;
  std::map<std::string, int> skips;
  std::map<std::string, int> skipped_ops;
  for (const Row& row : rows) {
    ++count[row.r.outcome];
    if (row.r.outcome == Outcome::kSkip) ++skips[SkipKey(row.r.reason)];
  }
  std::ostringstream os;
  os << "ONNX node tests (" << data_dir << "): " << rows.size() << " models\n";
  os << "pass " << count[Outcome::kPass] << " / skip " << count[Outcome::kSkip] << " / fail "
     << count[Outcome::kFail] << " (each passing model passes unfused AND fused)\n";
  int64_t ku = 0, kf = 0;
  int fused_models = 0;
  for (const Row& row : rows)
    if (row.r.outcome == Outcome::kPass) {
      ku += row.r.kernels_unfused, kf += row.r.kernels_fused;
      fused_models += row.r.kernels_fused < row.r.kernels_unfused;
    }
  os << "kernels per run over the passing models: " << ku << " unfused, " << kf << " fused (" << fused_models
     << " models fused)\n\n";
  std::vector<std::pair<std::string, int>> by_count(skips.begin(), skips.end());
  std::stable_sort(by_count.begin(), by_count.end(), [](auto& a, auto& b) { return a.second > b.second; });
  os << "skip reasons (count  reason):\n";
  for (const auto& [k, n] : by_count) os << "  " << n << "  " << k << "\n";
  os << "\nfailures:\n";
  for (const Row& row : rows)
    if (row.r.outcome == Outcome::kFail)
      os << "  " << row.name << (row.r.float32 ? " [f32]" : "") << ": " << row.r.reason << "\n";
  os << "\nall results:\n";
  for (const Row& row : rows) {
    os << "  " << OutcomeName(row.r.outcome) << " " << row.name;
    if (row.r.outcome != Outcome::kPass) os << ": " << row.r.reason;
    os << "\n";
  }
  return os.str();
}

std::string ReportPath() {
  if (const char* p = std::getenv("GF_NODE_TESTS_REPORT")) return p;
#ifdef GF_NODE_TESTS_REPORT_DEFAULT
  return GF_NODE_TESTS_REPORT_DEFAULT;
#else
  return "onnx_node_tests.txt";
#endif
}

TEST(OnnxNodeTests, AllNodeTests) {
  const char* env_dir = std::getenv("GF_ONNX_NODE_DIR");
  const std::string data_dir = env_dir ? env_dir : "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::is_directory(data_dir)) GTEST_SKIP() << data_dir << " not found (install libonnx-testdata)";
  const char* filter = std::getenv("GF_NODE_TESTS_FILTER");
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(data_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("test_", 0) != 0) continue;
    if (filter && name.find(filter) == std::string::npos) continue;
    dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  ASSERT_FALSE(dirs.empty()) << "no test_* directories in " << data_dir;

  std::vector<Row> rows(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) rows[i].name = std::filesystem::path(dirs[i]).filename().string();
  const char* inproc = std::getenv("GF_NODE_TESTS_INPROCESS");
  if (inproc && std::string(inproc) == "1") {
    for (size_t i = 0; i < dirs.size(); ++i) rows[i].r = RunOne(dirs[i], 2);
  } else {
    const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    RunForked(dirs, rows, std::max(1, hw / 2), 2);
  }

  const std::string summary = Summarize(rows, data_dir);
  const std::string report = ReportPath();
  std::ofstream(report) << summary;
  // The table without the per-model list on stdout; the file has everything.
  std::cout << summary.substr(0, summary.find("\nall results:")) << "\n(full report: " << report << ")\n";

  std::string f32_failures;
  for (const Row& row : rows)
    if (row.r.outcome == Outcome::kFail && row.r.float32) f32_failures += StrCat("\n  ", row.name, ": ", row.r.reason);
  EXPECT_TRUE(f32_failures.empty()) << "f32 node tests of supported ops that fail:" << f32_failures;
}

}  // namespace
}  // namespace graphfuse::testing
