#include "engine/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what);
}

std::string os_reason(int err) { return std::strerror(err); }

// Returns 0 or errno.
int write_all(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

void check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) throw Error(flag + " needs a file path");
  if (fs::is_directory(path, ec) || path.back() == '/')
    throw Error(flag + " " + path + " is a directory; give a file path such as " +
                (fs::path(path) / "out").string());
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec))
    throw Error(flag + " " + path + ": directory " + dir.string() + " does not exist; create it first");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(flag + " " + path + ": directory " + dir.string() + " is not writable (" +
                os_reason(errno) + ")");
}

int Fd::close() {
  if (fd < 0) return 0;
  int rc = ::close(std::exchange(fd, -1));
  return rc == 0 ? 0 : errno;
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  static std::atomic<uint64_t> counter{0};  // two saves in one process never share a temp name
  tmp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  fd_.fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_.fd < 0)
    fail(target_, "cannot save: cannot create temporary file " + tmp_ + " (" + os_reason(errno) +
                      "); check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  fd_.close();
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* buf, size_t n) {
  if (int err = write_all(fd_.fd, buf, n))
    fail(target_, "cannot save: writing " + tmp_ + " failed (" + os_reason(err) + "); is the disk full?");
}

void AtomicFile::commit() {
  // fsync before rename: otherwise a crash can leave PATH renamed but with its blocks unwritten.
  if (::fsync(fd_.fd) != 0)
    fail(target_, "cannot save: flushing " + tmp_ + " to disk failed (" + os_reason(errno) + ")");
  if (int err = fd_.close())
    fail(target_, "cannot save: closing " + tmp_ + " failed (" + os_reason(err) + ")");
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    fail(target_, "cannot save: renaming " + tmp_ + " over it failed (" + os_reason(errno) + ")");
  committed_ = true;
  // The rename itself lives in the directory; sync it so the new name survives a crash.
  std::string dir = std::filesystem::path(target_).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.fd < 0 || (::fsync(dfd.fd) != 0 && errno != EINVAL))  // EINVAL: fs can't sync dirs
    fail(target_, "saved, but syncing directory " + dir + " failed (" + os_reason(errno) + ")");
}

}  // namespace dtlab
