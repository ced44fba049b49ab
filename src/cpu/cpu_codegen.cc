#include "cpu/cpu_codegen.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/cache_dir.h"
#include "core/hash.h"
#include "core/shared_object.h"

// Set by CMakeLists.txt: the headers the generated code includes (paths relative to a root that
// holds include/ and src/), where they live (the source tree; the installed copy, under the
// install prefix's GF_CODEGEN_DATADIR), and how the library itself was compiled (the loops must
// be compiled the same way to give its bits). A build that does not set them (the fuzz build)
// gets a generator that Create refuses.
#ifndef GF_SOURCE_ROOT
#define GF_SOURCE_ROOT ""
#define GF_CODEGEN_HEADERS ""
#define GF_CODEGEN_DATADIR ""
#define GF_INSTALL_PREFIX ""
#define GF_CODEGEN_CXX "c++"
#define GF_CODEGEN_FLAGS ""
#define GF_CODEGEN_LIBS ""
#endif

namespace graphfuse {

struct CpuCodegen::Impl {
  Options options;
  std::string compile;     // the command prefix
  std::string key_prefix;  // compiler version, flags and headers: part of every cache key
  mutable std::mutex mu;
  // By the program's shape (GetNativeKernel): the loaded object and its loop.
  std::map<std::string, std::pair<std::shared_ptr<SharedObject>, cpu::NativeKernel>> kernels;
  // Programs whose compile or load failed, with the error: not tried again (a GEMM epilogue
  // asks on every launch, and each try costs a compile).
  std::map<std::string, Status> failures;
  Stats stats;
};

namespace {

// Every cached kernel's file name starts with this (PruneCache removes only those).
constexpr const char* kKernelPrefix = "gf_cpu_";

// Removes the least recently used kernels (gf_cpu_*.so, oldest modification time first) while
// they take more than limit * 3/4 bytes, when they take more than `limit`; returns how many.
// Errors (a file another process removed first) are skipped: the cache is only a cache.
int PruneCache(const std::string& dir, int64_t limit) {
  if (limit <= 0) return 0;
  namespace fs = std::filesystem;
  struct Entry {
    fs::path path;
    fs::file_time_type time;
    int64_t bytes;
  };
  std::vector<Entry> kernels;
  int64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (name.rfind(kKernelPrefix, 0) != 0 || p.extension() != ".so") continue;
    std::error_code e1, e2;
    const auto bytes = fs::file_size(p, e1);
    const auto time = fs::last_write_time(p, e2);
    if (e1 || e2) continue;
    kernels.push_back({p, time, static_cast<int64_t>(bytes)});
    total += static_cast<int64_t>(bytes);
  }
  if (total <= limit) return 0;
  std::sort(kernels.begin(), kernels.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  int removed = 0;
  for (const Entry& e : kernels) {
    if (total <= limit / 4 * 3) break;
    std::error_code rm;
    if (fs::remove(e.path, rm)) total -= e.bytes, ++removed;
  }
  return removed;
}

// The first line a command prints, or "" when it fails.
std::string FirstLineOf(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!f) return "";
  char buf[512] = {0};
  const bool got = fgets(buf, sizeof buf, f) != nullptr;
  if (pclose(f) != 0 || !got) return "";
  std::string line(buf);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

std::vector<std::string> CodegenHeaders() {
  std::vector<std::string> out;
  std::string list = GF_CODEGEN_HEADERS;
  for (size_t start = 0; start < list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool HasHeaders(const std::filesystem::path& root, const std::vector<std::string>& headers) {
  std::error_code ec;
  for (const std::string& h : headers)
    if (!std::filesystem::is_regular_file(root / h, ec)) return false;
  return !headers.empty();
}

// Where the generated loops find their headers: $GF_CODEGEN_ROOT when set; else the installed
// copy beside the binary this code was loaded from (<prefix>/lib/libgraphfuse.so or
// <prefix>/bin/graphfuse: <prefix>/GF_CODEGEN_DATADIR), so an installation works wherever it
// was moved; else the source tree this library was built from; else the installed copy under
// the prefix it was configured with. Empty when none holds them all.
std::filesystem::path CodegenRoot(const std::vector<std::string>& headers) {
  if (const char* env = std::getenv("GF_CODEGEN_ROOT"); env && *env) return env;
  std::vector<std::filesystem::path> candidates;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&CodegenRoot), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::canonical(info.dli_fname, ec);
    if (!ec) candidates.push_back(self.parent_path().parent_path() / GF_CODEGEN_DATADIR);
  }
  candidates.push_back(GF_SOURCE_ROOT);
  candidates.push_back(std::filesystem::path(GF_INSTALL_PREFIX) / GF_CODEGEN_DATADIR);
  for (const auto& c : candidates)
    if (!c.empty() && HasHeaders(c, headers)) return c;
  return {};
}

}  // namespace

Result<std::unique_ptr<CpuCodegen>> CpuCodegen::Create() { return Create(Options{}); }

Result<std::unique_ptr<CpuCodegen>> CpuCodegen::Create(const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.compiler.empty()) {
    const char* cxx = std::getenv("CXX");
    impl->options.compiler = cxx && *cxx ? cxx : GF_CODEGEN_CXX;
  }
  if (impl->options.cache_dir.empty()) impl->options.cache_dir = UserCacheDir("cpu").string();
  const std::vector<std::string> header_names = CodegenHeaders();
  if (header_names.empty()) return Unimplemented("CPU code generation: this build of graphfuse does not list its headers");
  const std::filesystem::path root = CodegenRoot(header_names);
  if (root.empty())
    return NotFound("CPU code generation needs graphfuse's headers (", header_names.front(),
                    ", ...): not found in an installed copy (", GF_CODEGEN_DATADIR, ") nor in the source tree '",
                    GF_SOURCE_ROOT, "'; set GF_CODEGEN_ROOT to a directory that holds them");
  const std::string version = FirstLineOf(impl->options.compiler + " --version");
  if (version.empty())
    return NotFound("CPU code generation: the compiler '", impl->options.compiler,
                              "' does not run (set CXX, or CpuCodegen::Options::compiler)");
  // The headers the loops include, and everything they include from the project.
  std::string headers;
  for (const std::string& h : header_names) {
    std::string text;
    if (!ReadFile(root / h, &text)) return NotFound("CPU code generation: cannot read '", (root / h).string(), "'");
    headers += h + '\n' + text;
  }
  impl->compile = StrCat(impl->options.compiler, " ", GF_CODEGEN_FLAGS, " -I", ShellQuote((root / "src").string()), " -I",
                         ShellQuote((root / "include").string()));
  impl->key_prefix = StrCat(version, '\n', impl->compile, '\n', GF_CODEGEN_LIBS, '\n', Fnv1a64(headers), '\n');
  impl->stats.pruned = PruneCache(impl->options.cache_dir, impl->options.cache_limit_bytes);
  return std::unique_ptr<CpuCodegen>(new CpuCodegen(std::move(impl)));
}

CpuCodegen::CpuCodegen(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuCodegen::~CpuCodegen() = default;

CpuCodegen::Stats CpuCodegen::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

const std::string& CpuCodegen::cache_dir() const { return impl_->options.cache_dir; }

namespace cpu {

namespace {

// Elements ahead of the loop that the streamed loop prefetches its row inputs.
constexpr int64_t kStreamPrefetch = 256;

// "F32", "F16" or "BF16": the suffix of native_io.h's loads and stores.
const char* IoSuffix(DType t) { return t == DType::kF16 ? "F16" : t == DType::kBF16 ? "BF16" : "F32"; }

}  // namespace

std::string NativeSource(const NativeProgram& p, const std::string& symbol) {
  const int nin = static_cast<int>(p.inputs.size());
  std::string ops;
  for (const TileInstr& ins : p.instrs) ops += StrCat(ops.empty() ? "" : ", ", OpName(ins.op));
  std::string s = StrCat("// graphfuse CPU kernel: ", ops, R"(
#include <algorithm>
#include "cpu/native_io.h"
#include "cpu/op_rows.h"
#include <hwy/cache_control.h>
using namespace graphfuse;
using namespace graphfuse::cpu::native;
using namespace graphfuse::cpu::rows;
using graphfuse::simd::VF;
extern "C" void )", symbol,
                         R"((const void* const* in, void* const* out, const OpAttrs* a, const int64_t* rs,
                         int64_t cols, int64_t begin, int64_t end, int stream) {
  constexpr int64_t L = graphfuse::simd::kLanes;
)");
  for (int k = 0; k < nin; ++k)
    if (p.inputs[k] == NativeRead::kScalar)
      s += StrCat("  const VF r", k, " = VF(static_cast<double>(Scalar", IoSuffix(p.input_dtypes[k]), "(in[", k, "], 0)));\n");
  s += R"(  int64_t row = begin / cols, col = begin - row * cols;
  for (int64_t i = begin; i < end; ++row, col = 0) {
    const int64_t n = std::min(end - i, cols - col);
)";
  for (int k = 0; k < nin; ++k) {
    if (p.inputs[k] == NativeRead::kRow) s += StrCat("    const int64_t b", k, " = row * rs[", k, "] + col;\n");
    if (p.inputs[k] == NativeRead::kPerRow)
      s += StrCat("    const VF r", k, " = VF(static_cast<double>(Scalar", IoSuffix(p.input_dtypes[k]), "(in[", k,
                  "], row * rs[", k, "])));\n");
  }
  // The loop body over one vector at j; `tail`: the last n - j < L elements of the row.
  auto body = [&](bool tail) {
    std::string b;
    for (int k = 0; k < nin; ++k)
      if (p.inputs[k] == NativeRead::kRow)
        b += StrCat("        const VF r", k, " = Load", tail ? "Tail" : "", IoSuffix(p.input_dtypes[k]), "(in[", k, "], b", k,
                    " + j", tail ? ", n - j" : "", ");\n");
    for (size_t i = 0; i < p.instrs.size(); ++i) {
      const TileInstr& ins = p.instrs[i];
      const int arity = GetOpInfo(ins.op).arity;
      const int x = ins.args[0], y = arity > 1 ? ins.args[1] : x, z = arity > 2 ? ins.args[2] : x;
      b += StrCat("        const VF r", nin + static_cast<int>(i), " = ", OpName(ins.op), "Row::Eval<VF, int64_t>(r", x,
                  ", r", y, ", r", z, ", a[", i, "], i + j);\n");
    }
    return b;
  };
  auto stores = [&](bool streamed, bool tail) {
    std::string b;
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const bool nt = streamed && !tail && p.output_dtypes[o] == DType::kF32;
      b += StrCat("        ", nt ? "Stream" : tail ? "StoreTail" : "Store", IoSuffix(p.output_dtypes[o]), "(r",
                  p.outputs[o], ", out[", o, "], i + j", tail ? ", n - j" : "", ");\n");
    }
    return b;
  };
  // Launches stored non-temporally (far larger than the caches) read their row inputs from
  // memory: each is prefetched kStreamPrefetch elements ahead. The plain loop has no prefetch:
  // its inputs are in cache, and prefetching there gained nothing.
  std::string prefetch;
  for (int k = 0; k < nin; ++k)
    if (p.inputs[k] == NativeRead::kRow)
      prefetch += StrCat("        hwy::Prefetch(static_cast<const char*>(in[", k, "]) + (b", k, " + j + ", kStreamPrefetch,
                         ") * ", DTypeSize(p.input_dtypes[k]), ");\n");
  // Non-temporal stores of the f32 outputs (rows of whole vectors only), or plain ones; then
  // the row's ragged end, if any.
  s += "    int64_t j = 0;\n";
  for (const bool streamed : {true, false})
    s += StrCat(streamed ? "    if (stream) {\n" : "    } else {\n", "      for (; j + L <= n; j += L) {\n",
                streamed ? prefetch : "", body(false), stores(streamed, false), "      }\n");
  s += StrCat("    }\n    if (j < n) {\n", body(true), stores(false, true), "    }\n    i += n;\n  }\n}\n");
  return s;
}

Result<NativeCode> GetNativeKernel(CpuCodegen& cg, const NativeProgram& p) {
  CpuCodegen::Impl& im = cg.impl();
  // In memory, kernels are found by what determines their source (cheap: runners are built
  // on every launch of a GEMM or norm epilogue); the source is generated only on a miss.
  std::string shape;
  for (size_t k = 0; k < p.inputs.size(); ++k)
    shape += StrCat("i", static_cast<int>(p.inputs[k]), ":", static_cast<int>(p.input_dtypes[k]), ";");
  for (const TileInstr& ins : p.instrs)
    shape += StrCat("x", static_cast<int>(ins.op), ":", ins.args[0], ",", ins.args[1], ",", ins.args[2], ";");
  for (size_t o = 0; o < p.outputs.size(); ++o)
    shape += StrCat("o", p.outputs[o], ":", static_cast<int>(p.output_dtypes[o]), ";");
  std::lock_guard<std::mutex> lock(im.mu);
  if (auto it = im.kernels.find(shape); it != im.kernels.end()) return NativeCode{it->second.second, it->second.first};
  if (auto it = im.failures.find(shape); it != im.failures.end()) return it->second;

  // On disk, by a hash of the source (under a fixed symbol), the compiler, its flags and the
  // headers; the name also says what the loop computes.
  constexpr const char* kSymbol = "gf_kernel";
  std::string source = NativeSource(p, kSymbol);
  const uint64_t key = Fnv1a64(source, Fnv1a64(im.key_prefix));
  std::string name = kKernelPrefix;  // then the ops, "_" between them
  for (size_t i = 0; i < p.instrs.size() && i < 6; ++i) {
    std::string op(OpName(p.instrs[i].op));
    std::transform(op.begin(), op.end(), op.begin(), [](unsigned char c) { return std::tolower(c); });
    name += (i ? "_" : "") + op;
  }
  if (p.instrs.size() > 6) name += StrCat("_and", p.instrs.size() - 6);
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  name += StrCat("_", hex);
  const std::string declared = StrCat("void ", kSymbol, "(");
  source.replace(source.find(declared), declared.size(), StrCat("void ", name, "("));

  const auto t0 = std::chrono::steady_clock::now();
  bool built = false;
  auto fail = [&](const Status& s) -> Status {
    ++im.stats.failed;
    im.stats.last_error = s.ToString();
    im.failures.emplace(shape, s);
    return s;
  };
  auto so = BuildSharedObject(source, im.compile, im.options.cache_dir, name, GF_CODEGEN_LIBS, &built);
  if (!so.ok()) return fail(so.status());
  auto lib = SharedObject::Open(*so);
  if (!lib.ok()) return fail(lib.status());
  auto sym = (*lib)->Symbol(name);
  if (!sym.ok()) return fail(sym.status());
  const auto kernel = reinterpret_cast<NativeKernel>(*sym);
  im.kernels[shape] = {*lib, kernel};
  if (built) {
    ++im.stats.compiled;
    im.stats.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    ++im.stats.loaded;
    std::error_code ec;  // used now: the cache's pruning removes the least recently used
    std::filesystem::last_write_time(*so, std::filesystem::file_time_type::clock::now(), ec);
  }
  return NativeCode{kernel, *lib};
}

void CountOutsideScope(CpuCodegen& cg, const std::string& why) {
  std::lock_guard<std::mutex> lock(cg.impl().mu);
  ++cg.impl().stats.outside_scope;
  ++cg.impl().stats.outside_why[why];
}

}  // namespace cpu

std::string CpuCodegen::Summary() const {
  const Stats s = stats();
  char head[160];
  std::snprintf(head, sizeof head, "%d compiled (%.1f s), %d from the cache, %d left to the tile executor", s.compiled,
                s.compile_seconds, s.loaded, s.outside_scope);
  std::string out = head;
  std::string why;
  for (const auto& [reason, count] : s.outside_why) why += StrCat(why.empty() ? "" : ", ", count, " with ", reason);
  out += why.empty() ? "" : StrCat(" (", why, ")");
  if (s.failed) out += StrCat("; ", s.failed, " failed to compile (the tile executor ran them): ", s.last_error);
  return out;
}

}  // namespace graphfuse
