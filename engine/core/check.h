// Errors. Two kinds, because they mean different things to the person at the keyboard:
//  - dtlab::Error: bad input (a flag, a file, a config). One sentence saying what is wrong and how
//    to fix it; front ends print it as is and exit with code 2.
//  - DTLAB_CHECK failures (dtlab::InternalError): a broken invariant inside the engine, reported with
//    file:line so it can be fixed.
#pragma once
#include <stdexcept>
#include <string>

namespace dtlab {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The whole run stops for one reason every rank found at once (the loss became non-finite): each
// rank raises the same sentence, and a world reports it once, without blaming a rank for it.
struct RunStopped : Error {
  using Error::Error;
};

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

// An allocation failed somewhere in this process (a rank's std::bad_alloc, or the front end's).
// Front ends then end the process with std::_Exit after printing their sentence: OpenBLAS's worker
// threads retry a failed buffer allocation forever (memory.c, blas_memory_alloc), and its exit
// handler joins them, so a normal exit would never return.
void mark_out_of_memory();
bool out_of_memory_seen();

[[noreturn]] void fail_check(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace dtlab

// DTLAB_CHECK(cond, "what is wrong; how to fix"): internal invariant, throws InternalError with file:line.
#define DTLAB_CHECK(cond, msg)                                              \
  do {                                                                      \
    if (!(cond)) ::dtlab::fail_check(__FILE__, __LINE__, #cond, (msg));     \
  } while (0)
