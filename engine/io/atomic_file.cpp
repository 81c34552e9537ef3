#include "engine/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

[[noreturn]] void fail_at(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

std::string os_reason(int err) { return std::strerror(err); }

namespace {

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

// The temp files being written now, for a signal handler to remove (async-signal-safe: fixed
// slots, atomics, unlink). A slot is 0 free, 1 being filled or emptied, 2 holding a path.
constexpr size_t kTempSlots = 32, kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};
  char path[kTempPathMax];
};
std::array<TempSlot, kTempSlots> g_temps;

int register_temp(const std::string& path) {
  if (path.size() >= kTempPathMax) return -1;
  for (size_t i = 0; i < kTempSlots; i++) {
    int expected = 0;
    if (!g_temps[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
    g_temps[i].state.store(2);
    return static_cast<int>(i);
  }
  return -1;  // more than kTempSlots saves at once: this one is only cleaned at the next save
}

void unregister_temp(int slot) {
  if (slot >= 0) g_temps[static_cast<size_t>(slot)].state.store(0);
}

extern "C" void remove_temps_and_die(int sig) {
  for (TempSlot& t : g_temps)
    if (t.state.load() == 2) ::unlink(t.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// "PATH.tmp.<pid>.<n>" left by a process that no longer runs (killed while saving): removed.
void remove_stale_temps(const std::string& target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::path(target).parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = fs::path(target).filename().string() + ".tmp.";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.<n>"
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || dot + 1 == rest.size() ||
        rest.find_first_not_of("0123456789.") != std::string::npos || rest.find('.', dot + 1) != std::string::npos)
      continue;
    const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its writer may still run
    fs::remove(it->path(), ec);
    ec.clear();
  }
}

}  // namespace

void remove_temp_files_on_signal() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction sa {};
    sa.sa_handler = remove_temps_and_die;
    sigemptyset(&sa.sa_mask);
    // Keep a handler someone else installed (the launcher forwards signals to its ranks).
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_DFL) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

std::string not_a_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (a named pipe)"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                   : "not a file";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a regular file; give the path of a file";
  return std::string("is ") + kind + ", not a regular file; save its contents to a file and give that path";
}

std::string not_a_regular_output(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return "";
  const char* kind = S_ISFIFO(st.st_mode)                          ? "a FIFO (a named pipe)"
                     : S_ISSOCK(st.st_mode)                        ? "a socket"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                   : "not a regular file";
  return std::string("is ") + kind + ", which a save would replace with a file; give the path of a regular file";
}

void check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) throw Error(flag + " needs a file path");
  if (fs::is_directory(path, ec) || path.back() == '/')
    throw Error(flag + " " + path + " is a directory; give a file path such as " +
                (fs::path(path) / ("out" + fs::path(path).filename().extension().string())).string());  // out.png in sub.png/
  if (const std::string what = not_a_regular_output(path); !what.empty()) throw Error(flag + " " + path + " " + what);
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
  // Every writer comes here: a FIFO, socket or device at the target is never renamed over (run as
  // root, a save to /dev/full would replace the machine's /dev/full).
  if (const std::string what = not_a_regular_output(target_); !what.empty()) fail_at(target_, "cannot save: it " + what);
  tmp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  remove_stale_temps(target_);
  // Registered before it exists: a signal between creating the file and registering it would leave it.
  slot_ = register_temp(tmp_);
  fd_.fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_.fd < 0) {
    const int err = errno;
    unregister_temp(std::exchange(slot_, -1));  // not ours to remove (O_EXCL: it may be another's)
    fail_at(target_, "cannot save: cannot create temporary file " + tmp_ + " (" + os_reason(err) +
                      "); check that the directory exists and is writable");
  }
}

AtomicFile::~AtomicFile() {
  fd_.close();
  if (!committed_) ::unlink(tmp_.c_str());
  unregister_temp(slot_);
}

void AtomicFile::write(const void* buf, size_t n) {
  if (int err = write_all(fd_.fd, buf, n))
    fail_at(target_, "cannot save: writing " + tmp_ + " failed (" + os_reason(err) + "); is the disk full?");
}

void AtomicFile::commit() {
  // fsync before rename: otherwise a crash can leave PATH renamed but with its blocks unwritten.
  if (::fsync(fd_.fd) != 0)
    fail_at(target_, "cannot save: flushing " + tmp_ + " to disk failed (" + os_reason(errno) + ")");
  if (int err = fd_.close())
    fail_at(target_, "cannot save: closing " + tmp_ + " failed (" + os_reason(err) + ")");
  if (const std::string what = not_a_regular_output(target_); !what.empty()) fail_at(target_, "cannot save: it " + what);
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    fail_at(target_, "cannot save: renaming " + tmp_ + " over it failed (" + os_reason(errno) + ")");
  committed_ = true;
  unregister_temp(std::exchange(slot_, -1));
  // The rename itself lives in the directory; sync it so the new name survives a crash.
  std::string dir = std::filesystem::path(target_).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.fd < 0 || (::fsync(dfd.fd) != 0 && errno != EINVAL))  // EINVAL: fs can't sync dirs
    fail_at(target_, "saved, but syncing directory " + dir + " failed (" + os_reason(errno) + ")");
}

}  // namespace dtlab
