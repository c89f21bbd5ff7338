// rootclad/model_file.h — files rootclad writes and reads from C++: a ROOT file written whole
// or not at all (write_root_file), and the flat JSON of an export's metadata.
#ifndef ROOTCLAD_MODEL_FILE_H
#define ROOTCLAD_MODEL_FILE_H

#include <TDirectory.h>
#include <TFile.h>
#include <TMD5.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

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

inline std::string md5_of(const std::string& path) {
  std::unique_ptr<TMD5> md5(TMD5::FileChecksum(path.c_str()));
  if (!md5)
    throw std::runtime_error("rootclad: cannot read " + path);
  return md5->AsString();
}

// A number per write_root_file call of the process: two threads writing one path never share
// a temporary file.
inline unsigned long next_write() {
  static std::atomic<unsigned long> count{0};
  return count++;
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
