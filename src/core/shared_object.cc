#include "core/shared_object.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace graphfuse {

bool ReadFile(const std::filesystem::path& p, std::string* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return static_cast<bool>(f) || f.eof();
}

std::string ShellQuote(const std::string& path) {
  std::string q = "'";
  for (char c : path) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Result<std::filesystem::path> BuildSharedObject(const std::string& source, const std::string& compile,
                                                const std::filesystem::path& dir, const std::string& stem, const std::string& libs,
                                                bool* built) {
  if (built) *built = false;
  const std::filesystem::path so = dir / (stem + ".so");
  std::error_code ec;
  if (std::filesystem::exists(so, ec)) return so;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("cannot create the kernel cache directory '", dir.string(), "': ", ec.message());
  const std::string unique = StrCat(".", getpid(), ".", std::random_device{}());
  const std::filesystem::path cc = dir / (stem + unique + ".cc"), tmp = dir / (stem + unique + ".so"),
                              log = dir / (stem + unique + ".log");
  {
    std::ofstream f(cc);
    f << source;
    if (!f) return Internal("cannot write '", cc.string(), "'");
  }
  const std::string cmd = StrCat(compile, " -o ", ShellQuote(tmp.string()), " ", ShellQuote(cc.string()), " ", libs, " > ",
                                 ShellQuote(log.string()), " 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    std::string text;
    ReadFile(log, &text);
    std::filesystem::remove(cc, ec);
    std::filesystem::remove(log, ec);
    std::filesystem::remove(tmp, ec);
    return Internal("compiling ", stem, " failed (", compile, "):\n", text.substr(0, 3000));
  }
  std::filesystem::rename(tmp, so, ec);
  if (ec) return Internal("cannot rename '", tmp.string(), "' to '", so.string(), "': ", ec.message());
  std::filesystem::remove(cc, ec);
  std::filesystem::remove(log, ec);
  if (built) *built = true;
  return so;
}

Result<std::shared_ptr<SharedObject>> SharedObject::Open(const std::filesystem::path& so) {
  std::shared_ptr<SharedObject> h(new SharedObject());
  h->path_ = so;
  h->handle_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h->handle_) return Internal("dlopen ", so.string(), ": ", dlerror());
  return h;
}

SharedObject::~SharedObject() {
  if (handle_) dlclose(handle_);
}

Result<void*> SharedObject::Symbol(const std::string& name) const {
  void* p = dlsym(handle_, name.c_str());
  if (!p) return Internal("no symbol '", name, "' in ", path_.string());
  return p;
}

}  // namespace graphfuse
