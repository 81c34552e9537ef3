// Helpers shared by the test suites.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "engine/core/check.h"

namespace dtlab::test {

// DTLAB_TEST_QUICK=1 (the sanitizer runs): suites drop their largest sizes.
inline bool quick() {
  const char* q = std::getenv("DTLAB_TEST_QUICK");
  return q && std::string(q) == "1";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The sentence of the dtlab::Error that `f` throws, or "(no error)".
inline std::string error_sentence(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A file's bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Checks that `msg` mentions every one of `parts`, naming the missing one.
inline void check_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) CHECK_MESSAGE(contains(msg, part), "missing '" << part << "' in: " << msg);
}

// The first line of `text` that starts with `prefix`, or "".
inline std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);)
    if (line.rfind(prefix, 0) == 0) return line;
  return "";
}

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "dtlab_test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  bool empty() const { return std::filesystem::is_empty(path); }
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path))
      names.insert(e.path().filename().string());
    return names;
  }
};

struct ShellResult {
  int code = -1;  // exit code; -1 when the command could not run or did not exit normally
  std::string out;
};

// LeakSanitizer's own stop-the-world tracer sometimes crashes at a process's exit (google/sanitizers
// #1353: "Tracer caught signal 11" then "LeakSanitizer has encountered a fatal error"), most often in
// the lab under Xvfb with Mesa's threads. That is the sanitizer failing, not a leak (a leak prints
// "ERROR: LeakSanitizer: detected memory leaks"), so such a run is retried; a real report never is.
inline bool lsan_tracer_crashed(const std::string& out) {
  return out.find("Tracer caught signal") != std::string::npos &&
         out.find("LeakSanitizer has encountered a fatal error") != std::string::npos &&
         out.find("detected memory leaks") == std::string::npos;
}

inline ShellResult shell_once(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs a shell command line, capturing stdout and stderr together (retried up to twice when only
// LeakSanitizer's tracer crashed at exit, above).
inline ShellResult shell(const std::string& cmd) {
  ShellResult r = shell_once(cmd);
  for (int retry = 0; retry < 2 && r.code != 0 && lsan_tracer_crashed(r.out); retry++) r = shell_once(cmd);
  return r;
}

#ifdef DTLAB_APP_PATH
// The lab under a fresh virtual display of 1280x720, its layout from `config_dir`. -noreset: without
// it Xvfb resets when the lab disconnects and signals xvfb-run (SIGUSR1); a signal that lands while
// xvfb-run removes its temporary directory makes it exit 5 ("problem while cleaning up temporary
// directory") whatever the lab returned, which failed a GUI test now and then.
inline ShellResult run_lab(const std::string& config_dir, const std::string& args) {
  return shell("xvfb-run -a -s '-screen 0 1280x720x24 -noreset' " DTLAB_APP_PATH " --width 1280 --height 720 --config-dir " +
               config_dir + " " + args);
}
#endif

// n floats uniform in [-scale, scale), the same for the same seed (op and parity tests).
inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

}  // namespace dtlab::test
