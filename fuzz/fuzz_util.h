// What the libFuzzer harnesses (fuzz/*.cpp) share: per-process temporary files for parsers that
// only take a path, and the rule for what counts as a finding. A parser rejecting bad bytes throws
// dtlab::Error (one sentence): that is expected. Anything else escapes the harness and libFuzzer
// reports it: a crash or sanitizer report, an InternalError, a std::exception of another kind, or
// a broken invariant that a harness checks with require().
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/core/check.h"

namespace dtlab::fuzz {

// $TMPDIR (else /tmp)/dtlab-fuzz-PID: one directory per process, so parallel fuzzers (-jobs,
// -fork) never share files. Created on first use, removed at a normal exit.
inline const std::string& temp_dir() {
  // Never destroyed: the atexit cleanup below runs after static destructors registered later.
  static const std::string& dir = *new std::string([] {
    const char* tmp = std::getenv("TMPDIR");
    const std::string d = std::string(tmp && *tmp ? tmp : "/tmp") + "/dtlab-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(temp_dir(), ec);
    });
    return d;
  }());
  return dir;
}

// Writes `size` bytes to temp_dir()/file (replacing it) and returns the path.
inline std::string write_temp(const std::string& file, const uint8_t* data, size_t size) {
  const std::string path = temp_dir() + "/" + file;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "dtlab fuzz: cannot write %s; is the temp directory full?\n", path.c_str());
    std::abort();
  }
  return path;
}

// A broken invariant of a parser that accepted its input: printed, then a crash libFuzzer reports.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "dtlab fuzz: invariant broken: %s\n", what);
  std::abort();
}

// Runs f; dtlab::Error (the parser's "bad input" sentence) is the expected rejection. Returns true
// when f returned normally.
template <class F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace dtlab::fuzz
