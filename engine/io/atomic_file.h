// Files that appear whole or not at all: bytes go to PATH.tmp.<pid>.<n> in the same directory,
// which is fsync'ed and renamed over PATH on commit() (then the directory is synced). Destroyed
// without commit() (an error, an exception), the temp file is removed: nothing half-written stays.
// A process killed while saving cannot remove its temp file: the next save of PATH removes every
// PATH.tmp.<pid>.<n> whose process is gone, and remove_temp_files_on_signal() makes SIGINT, SIGTERM
// and SIGHUP remove the ones being written before the process dies.
#pragma once
#include <cstddef>
#include <string>

namespace dtlab {

// Checks, before any work starts, that `path` can be written atomically: not a directory, and its
// directory exists and is writable. Throws dtlab::Error naming `flag` (e.g. "--save").
void check_output_path(const std::string& flag, const std::string& path);

// Installs handlers for SIGINT, SIGTERM and SIGHUP (where none is installed) that remove the temp
// files of saves in progress, then die of the signal as before. Front ends call it once at start.
void remove_temp_files_on_signal();

// What keeps `path` from being read as a file, as a clause ("is a FIFO (a named pipe), not a regular
// file; save its contents to a file and give that path"), or "" for a regular file or a path that does not exist
// (the caller's own sentence covers that). A FIFO with no writer would block the open forever, and a
// device such as /dev/zero never ends, so readers of input files check this before opening.
std::string not_a_regular_file(const std::string& path);

// What keeps `path` from being an output: "is a FIFO (a named pipe), which a save would replace with
// a file; give the path of a regular file" for a FIFO, socket or device (followed through symlinks),
// or "" for a regular file, a directory (check_output_path's own sentence) or a path that does not exist.
std::string not_a_regular_output(const std::string& path);

// The io layer's error sentences: "PATH: what" as a dtlab::Error, and strerror's text for an errno.
[[noreturn]] void fail_at(const std::string& path, const std::string& what);
std::string os_reason(int err);

// An owned POSIX file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int close();  // 0 or errno; close errors can report delayed write failures
};

// Errors are dtlab::Error sentences that start with the target path.
class AtomicFile {
 public:
  explicit AtomicFile(std::string target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* buf, size_t n);
  void commit();

 private:
  std::string target_, tmp_;
  Fd fd_{-1};
  int slot_ = -1;  // in the signal handler's table
  bool committed_ = false;
};

}  // namespace dtlab
