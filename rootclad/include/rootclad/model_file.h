// rootclad/model_file.h — files rootclad writes and reads from C++: a ROOT file written whole
// or not at all (write_root_file), the flat JSON of an export's metadata, and the private copy
// of an export's library that rootclad::Model loads (checked_library_copy).
#ifndef ROOTCLAD_MODEL_FILE_H
#define ROOTCLAD_MODEL_FILE_H

#include <TDirectory.h>
#include <TFile.h>
#include <TLeaf.h>
#include <TMD5.h>
#include <TSystem.h>
#include <TTree.h>

// Files are asked about through TSystem (GetPathInfo) and written through <cstdio>, not
// <sys/stat.h> and <fcntl.h>: Cling parses those two as text, and a macro that included them
// failed when run again in one session ("#else after #else" in sys/stat.h, depending on where
// its text fell; tests/root/test_root_session.py). <pthread.h> and <cstdio> come from Cling's
// modules, and <unistd.h> (getcwd) was there before without harm.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "model_api.h"

namespace rootclad {

namespace detail {

// The value of "key": in the flat JSON object rootclad writes (strings and numbers only).
inline std::string json_field(const std::string& json, const std::string& key) {
  const std::string tag = "\"" + key + "\": ";
  const auto at = json.find(tag);
  if (at == std::string::npos)
    return "";
  auto begin = at + tag.size();
  if (json[begin] == '"') {
    const auto end = json.find('"', begin + 1);
    return json.substr(begin + 1, end - begin - 1);
  }
  const auto end = json.find_first_of(",}", begin);
  return json.substr(begin, end - begin);
}

// The array of strings (["a", "b"]) or integers ([1, 4]) under "key": of the metadata's JSON,
// as Python's json.dumps writes it (escapes, \uXXXX and surrogate pairs); empty when the key
// is absent or null.
inline std::vector<std::string> json_array(const std::string& json, const std::string& key) {
  std::vector<std::string> out;
  const std::string tag = "\"" + key + "\": [";
  size_t at = json.find(tag);
  if (at == std::string::npos)
    return out;
  at += tag.size();
  auto fail = [&] {
    throw std::runtime_error("rootclad: malformed metadata array \"" + key + "\"");
  };
  auto hex4 = [&](size_t i) {
    if (i + 4 > json.size())
      fail();
    for (size_t k = i; k < i + 4; ++k)
      if (!std::isxdigit((unsigned char)json[k]))
        fail();
    return (unsigned)std::stoul(json.substr(i, 4), nullptr, 16);
  };
  auto utf8 = [](std::string& s, unsigned c) {
    if (c < 0x80) {
      s += (char)c;
    } else if (c < 0x800) {
      s += (char)(0xC0 | (c >> 6));
      s += (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += (char)(0xE0 | (c >> 12));
      s += (char)(0x80 | ((c >> 6) & 0x3F));
      s += (char)(0x80 | (c & 0x3F));
    } else {
      s += (char)(0xF0 | (c >> 18));
      s += (char)(0x80 | ((c >> 12) & 0x3F));
      s += (char)(0x80 | ((c >> 6) & 0x3F));
      s += (char)(0x80 | (c & 0x3F));
    }
  };
  while (at < json.size()) {
    while (at < json.size() && json[at] == ' ')
      ++at;
    if (at >= json.size())
      fail();
    if (json[at] == ']')
      return out;
    std::string item;
    if (json[at] == '"') {
      for (++at; at < json.size() && json[at] != '"'; ++at) {
        if (json[at] != '\\') {
          item += json[at];
          continue;
        }
        if (++at >= json.size())
          fail();
        const char e = json[at];
        const char* plain = "\"\\/bfnrt";
        const char* value = "\"\\/\b\f\n\r\t";
        if (const char* k = std::strchr(plain, e); k && e)
          item += value[k - plain];
        else if (e == 'u') {
          unsigned c = hex4(at + 1);
          at += 4;
          if (c >= 0xD800 && c < 0xDC00 && json.compare(at + 1, 2, "\\u") == 0) {
            const unsigned low = hex4(at + 3);
            if (low >= 0xDC00 && low < 0xE000) { // a pair; else each escape stands alone
              c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
              at += 6;
            }
          }
          utf8(item, c);
        } else
          fail();
      }
      if (at >= json.size())
        fail();
      ++at; // the closing quote
    } else {
      const size_t end = json.find_first_of(",]", at);
      if (end == std::string::npos)
        fail();
      item = json.substr(at, end - at);
      at = end;
    }
    out.push_back(item);
    while (at < json.size() && json[at] == ' ')
      ++at;
    if (at < json.size() && json[at] == ',')
      ++at;
    else if (at >= json.size() || json[at] != ']')
      fail();
  }
  fail();
  return out;
}

// What an export says its input is (cm.export(stem, schema=...)): the columns in order with
// their values per event, the target and weight columns training read, the class names.
// Empty for an export written without a schema.
struct Schema {
  std::vector<std::string> columns, classes;
  std::vector<long> lengths;
  std::string target, weight;
};

inline Schema read_schema(const std::string& json) {
  Schema s;
  s.columns = json_array(json, "input_columns");
  for (const auto& n : json_array(json, "input_lengths"))
    s.lengths.push_back(std::stol(n));
  s.classes = json_array(json, "classes");
  for (auto* f : {&s.target, &s.weight}) {
    *f = json_field(json, f == &s.target ? "target" : "weight");
    if (*f == "null")
      f->clear();
  }
  if (s.columns.size() != s.lengths.size())
    throw std::runtime_error("rootclad: the metadata's input_columns and input_lengths differ");
  return s;
}

inline std::string shape_str(const std::vector<long>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// The one entry of branch `name` of `t` into `to`, as doubles: stored doubles as they are,
// floats (uproot writes float32 when asked) widened, which is exact. Another type, or a
// read that fails, throws naming `what`: ROOT itself only prints an error and leaves `to`
// as it was.
inline void read_doubles(TTree& t, const char* name, double* to, const std::string& what) {
  TLeaf* leaf = t.GetLeaf(name);
  const std::string type = leaf ? leaf->GetTypeName() : "";
  if (type != "Double_t" && type != "Float_t")
    throw std::runtime_error("rootclad: " + what + " is stored as " +
                             (leaf ? type + " (" + leaf->GetTitle() + ")" : "nothing") +
                             "; expected double (or float) values");
  std::vector<float> floats(type == "Float_t" ? leaf->GetLen() : 0);
  const bool read = t.SetBranchAddress(name, floats.empty() ? (void*)to : floats.data()) >= 0 &&
                    t.GetBranch(name)->GetEntry(0) > 0;
  t.ResetBranchAddresses();
  if (!read)
    throw std::runtime_error("rootclad: cannot read " + what + " (truncated or corrupt file?)");
  std::copy(floats.begin(), floats.end(), to);
}

// A path as the working directory resolves it: relative paths made absolute, so that dlopen
// (which searches the library path for a name without a slash) opens the file the user named,
// and messages say which file that was.
inline std::string resolved(const std::string& path) {
  if (path.empty() || path[0] == '/')
    return path;
  std::string cwd(4096, '\0');
  if (!getcwd(&cwd[0], cwd.size()))
    return "./" + path; // still a path for dlopen, not a name to search for
  cwd.resize(std::strlen(cwd.c_str()));
  return cwd + "/" + (path.compare(0, 2, "./") == 0 ? path.substr(2) : path);
}

// A number per temporary file of the process (write_root_file, copy_library): two
// threads writing one path never share a temporary file.
inline unsigned long next_write() {
  static std::atomic<unsigned long> count{0};
  return count++;
}

// Refuses a directory rootclad loads code from when another user (root excepted) owns it or
// group or others can write to it: they could put their code where it is loaded (as the
// compile cache, rootclad/toolchain/build.py: _check_trusted).
inline void check_private_dir(const std::string& dir) {
  FileStat_t st;
  if (gSystem->GetPathInfo(dir.c_str(), st) != 0 || !R_ISDIR(st.fMode))
    throw std::runtime_error("rootclad: " + dir + " is not a directory");
  const std::string fix = "set ROOTCLAD_CACHE_DIR to a directory of your own";
  const int me = gSystem->GetEffectiveUid();
  if (st.fUid != me && st.fUid != 0)
    throw std::runtime_error("rootclad: " + dir + " is owned by uid " + std::to_string(st.fUid) +
                             ", not by you (uid " + std::to_string(me) +
                             "): another user could put code there that rootclad would load and "
                             "run as you; " +
                             fix);
  if (st.fMode & 022) {
    const char* who = (st.fMode & 022) == 022 ? "group and others"
                      : (st.fMode & 020)      ? "group"
                                              : "others";
    char mode[8];
    std::snprintf(mode, sizeof mode, "%o", (unsigned)(st.fMode & 07777));
    throw std::runtime_error("rootclad: " + dir + " is writable by " + who + " (mode " + mode +
                             "): they could put code there that rootclad would load and run as "
                             "you; `chmod 700 " +
                             dir + "` or " + fix);
  }
}

// `dir` and its missing parents, made 0700 whatever the umask.
inline void make_private_dir(const std::string& dir) {
  FileStat_t st;
  if (gSystem->GetPathInfo(dir.c_str(), st) == 0)
    return;
  const auto slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0)
    make_private_dir(dir.substr(0, slash));
  if (gSystem->MakeDirectory(dir.c_str()) != 0) {
    const int err = TSystem::GetErrno();
    if (err == EEXIST) // made by another process meanwhile: checked like any other
      return;
    throw std::runtime_error("rootclad: cannot make " + dir + " (" + std::strerror(err) +
                             "), where rootclad keeps a copy of each library it loads; set "
                             "ROOTCLAD_CACHE_DIR to a directory of your own");
  }
  // TSystem makes it 0755 (masked by the umask): private before anything is put there
  if (gSystem->Chmod(dir.c_str(), 0700) != 0)
    throw std::runtime_error("rootclad: cannot make " + dir +
                             " private (chmod 700: " + std::strerror(TSystem::GetErrno()) +
                             "); set ROOTCLAD_CACHE_DIR to a directory of your own");
}

// Where rootclad::Model keeps the libraries it loads: "exports" in the compile cache
// ($ROOTCLAD_CACHE_DIR, default ~/.cache/rootclad), made 0700 and checked as the cache is.
inline std::string library_dir() {
  std::string base;
  if (const char* env = std::getenv("ROOTCLAD_CACHE_DIR"); env && *env) {
    base = env;
  } else {
    const char* home = std::getenv("HOME"); // (Cling cannot parse <pwd.h> for getpwuid)
    if (!home || !*home)
      throw std::runtime_error("rootclad: HOME is not set, so there is no ~/.cache/rootclad to "
                               "keep a copy of each library rootclad loads; set "
                               "ROOTCLAD_CACHE_DIR to a directory of your own");
    base = std::string(home) + "/.cache/rootclad";
  }
  base = resolved(base);
  while (base.size() > 1 && base.back() == '/')
    base.pop_back();
  const std::string dir = base + "/exports";
  make_private_dir(dir);
  check_private_dir(base);
  check_private_dir(dir);
  return dir;
}

// The library `lib` copied into `dir` as <its MD5>.so: written to a temporary name, its MD5
// computed from the bytes written, compared with `want` (the MD5 the weights `weights` record),
// then renamed. What is loaded is what was checked, whatever happens to `lib` meanwhile or
// later (replaced by a rename, which dlopen would not see under the same path, or rewritten in
// place under a running model); a library of other content has another path, so reopening
// after a change loads the new one.
inline std::string copy_library(const std::string& lib, const std::string& want,
                                const std::string& weights, const std::string& dir) {
  const std::string tmp = dir + "/.library." + std::to_string(::getpid()) + "." +
                          std::to_string(next_write()) + ".partial";
  // "e": close on exec; "x": created here or not at all (a link or file put there is refused)
  std::FILE* in = std::fopen(lib.c_str(), "rbe");
  if (!in)
    throw std::runtime_error("rootclad: cannot read " + lib + ": " + std::strerror(errno));
  std::FILE* out = std::fopen(tmp.c_str(), "wbxe");
  if (!out) {
    const int err = errno;
    std::fclose(in);
    throw std::runtime_error("rootclad: cannot write in " + dir + ": " + std::strerror(err));
  }
  TMD5 md5;
  std::vector<char> buf(1 << 20);
  int err = 0;
  errno = 0; // what a failed read or write leaves here names the cause
  for (;;) {
    const std::size_t n = std::fread(buf.data(), 1, buf.size(), in);
    if (n == 0) {
      err = std::ferror(in) ? (errno ? errno : EIO) : 0;
      break;
    }
    md5.Update(reinterpret_cast<const UChar_t*>(buf.data()), (UInt_t)n);
    if (std::fwrite(buf.data(), 1, n, out) != n) {
      err = errno ? errno : EIO;
      break;
    }
  }
  std::fclose(in);
  if (std::fclose(out) != 0 && !err)
    err = errno ? errno : EIO;
  if (err) {
    std::remove(tmp.c_str());
    throw std::runtime_error("rootclad: cannot copy " + lib + " to " + dir + ": " +
                             std::strerror(err));
  }
  md5.Final();
  const std::string have = md5.AsString();
  if (have != want) {
    std::remove(tmp.c_str());
    throw std::runtime_error("rootclad: " + lib + " is not the library " + weights +
                             " was exported with (MD5 " + have + ", expected " + want +
                             "): a stale or foreign library");
  }
  const std::string path = dir + "/" + have + ".so";
  // fopen made it 0666 less the umask: the copy is as private as its directory (0700)
  if (gSystem->Chmod(tmp.c_str(), 0700) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error("rootclad: cannot write " + path + ": " + std::strerror(e));
  }
  return path;
}

// The copies this process has made and checked: one per library file and the MD5 its weights
// record (the key: directory, MD5 and path), so that the Models of one export (one per
// RDataFrame slot or worker thread) copy and hash the library once. Each entry keeps the
// file's identity when it was checked (device, inode, size and modification time in seconds,
// as TSystem::GetPathInfo gives them): a library replaced, rewritten to another size or in
// another second than at its last check, or weights that record another MD5, are copied and
// checked again, so a stale library is refused however often it is opened. (Rewritten at the
// same size within the second of its last check, the copy already checked against the weights
// is what runs.)
// A pthread mutex, locked and unlocked by hand: with std::mutex and a lock object in the
// function, a macro that includes this header crashed Cling when run a second time
// (tests/root/test_root_session.py).
struct CheckedCopies {
  struct Copy {
    std::string identity; // of the file when it was checked
    std::string path;     // <dir>/<MD5>.so
  };
  pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  std::map<std::string, Copy> copies; // <dir>\n<MD5>\n<path> -> the last copy checked
};

inline CheckedCopies& checked_copies() {
  static CheckedCopies copies;
  return copies;
}

// The copy of `lib` for `key` (below), made unless this process made it from the file as it is
// now (`identity`) and the copy is still there; a failed check forgets the file.
inline std::string cached_copy(CheckedCopies& checked, const std::string& key,
                               const std::string& identity, const std::string& lib,
                               const std::string& want, const std::string& weights,
                               const std::string& dir) {
  const auto it = checked.copies.find(key);
  FileStat_t copy;
  if (it != checked.copies.end() && it->second.identity == identity &&
      gSystem->GetPathInfo(it->second.path.c_str(), copy) == 0 && R_ISREG(copy.fMode))
    return it->second.path;
  checked.copies.erase(key);
  const std::string path = copy_library(lib, want, weights, dir);
  checked.copies[key] = {identity, path};
  return path;
}

// The path rootclad::Model loads for `lib`, whose weights `weights` record the MD5 `want`: the
// copy made by copy_library in library_dir(), at most once per process for a file unchanged.
inline std::string checked_library_copy(const std::string& lib, const std::string& want,
                                        const std::string& weights) {
  const std::string dir = library_dir(); // checked at every open: its mode may have changed
  FileStat_t st;
  if (gSystem->GetPathInfo(lib.c_str(), st) != 0)
    throw std::runtime_error("rootclad: cannot read " + lib + ": " +
                             std::strerror(TSystem::GetErrno()));
  std::string identity;
  for (const long long n :
       {(long long)st.fDev, (long long)st.fIno, (long long)st.fSize, (long long)st.fMtime})
    identity += std::to_string(n) + ' ';
  CheckedCopies& checked = checked_copies();
  pthread_mutex_lock(&checked.mutex);
  std::string path;
  try {
    path = cached_copy(checked, dir + '\n' + want + '\n' + lib, identity, lib, want, weights, dir);
  } catch (...) {
    pthread_mutex_unlock(&checked.mutex);
    throw;
  }
  pthread_mutex_unlock(&checked.mutex);
  return path;
}

// The export's library `lib` opened from its checked copy (checked_library_copy), the
// messages naming `lib`; dlopen returns the copy already open for a path opened before, which
// holds the same bytes (its name is their hash).
inline ModelApi open_export_library(const std::string& lib, const std::string& want,
                                    const std::string& weights, const std::string& prefix) {
  const std::string copy = checked_library_copy(lib, want, weights);
  void* handle = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = ::dlerror();
    throw std::runtime_error("rootclad: cannot load " + lib + " (its checked copy " + copy +
                             "): " + (err ? err : "unknown dlopen error"));
  }
  return make_model_api(
      lib, prefix, [handle](const std::string& symbol) { return ::dlsym(handle, symbol.c_str()); });
}

// A TFile that keeps the cause of a failed write: ROOT only sets kWriteError and prints errno,
// which later calls overwrite. A short write (the disk filled mid-buffer) is continued so that
// the kernel says why, and the data are synced before the close, so that a disk that fills
// while the kernel writes back (delayed allocation, NFS, quotas) is seen here too.
class CheckedFile : public TFile {
public:
  explicit CheckedFile(const std::string& path) : TFile(path.c_str(), "RECREATE") {
    if (IsZombie() || TestBit(kWriteError)) // the base class wrote the header without us
      remember(errno ? errno : EIO);
  }
  int error = 0; // the first errno of a failed write, sync or close; 0: none

protected:
  Int_t SysWrite(Int_t fd, const void* buf, Int_t len) override {
    for (Int_t done = 0; done < len;) {
      const Int_t n = TFile::SysWrite(fd, static_cast<const char*>(buf) + done, len - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        remember(n < 0 ? errno : EIO);
        return -1;
      }
      done += n;
    }
    return len;
  }
  Int_t SysClose(Int_t fd) override {
    if (fd >= 0 && ::fsync(fd) != 0)
      remember(errno);
    const Int_t status = TFile::SysClose(fd);
    if (status != 0)
      remember(errno);
    return status;
  }

private:
  void remember(int err) {
    if (!error)
      error = err;
  }
};

} // namespace detail

// Writes the ROOT file `path` whole or not at all: fill(TFile&) writes into a temporary file
// beside it, which is checked (every write, the sync and the close) and then renamed over
// `path`. When anything fails or fill throws, the temporary file is removed, a file already at
// `path` is left as it was, and std::runtime_error names `path` and the cause ("No space left
// on device"). Every ROOT file rootclad writes from C++ goes through here.
template <class Fill> void write_root_file(const std::string& path, Fill&& fill) {
  if (path.find_first_of("#?") != std::string::npos) // TFile would open another file
    throw std::invalid_argument("rootclad: cannot write " + path +
                                ": ROOT reads what follows '#' or '?' in a file name as an "
                                "anchor or options; choose a name without them");
  const auto slash = path.rfind('/') + 1; // 0 without a directory
  const std::string tmp = path.substr(0, slash) + "." + path.substr(slash) + "." +
                          std::to_string(::getpid()) + "." + std::to_string(detail::next_write()) +
                          ".partial";
  auto fail = [&](int err) {
    std::remove(tmp.c_str());
    throw std::runtime_error("rootclad: cannot write " + path + ": " + std::strerror(err));
  };
  {
    TDirectory::TContext keep; // the caller's current directory is restored
    detail::CheckedFile f(tmp);
    if (f.IsZombie())
      fail(f.error);
    try {
      fill(static_cast<TFile&>(f));
    } catch (...) {
      f.Close();
      std::remove(tmp.c_str());
      throw;
    }
    f.Close();
    if (f.error || f.TestBit(TFile::kWriteError))
      fail(f.error ? f.error : EIO);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(errno);
}

} // namespace rootclad

#endif // ROOTCLAD_MODEL_FILE_H
