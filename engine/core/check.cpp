#include "engine/core/check.h"

#include <atomic>

namespace dtlab {

namespace {
std::atomic<bool> g_out_of_memory{false};
}

void mark_out_of_memory() { g_out_of_memory.store(true); }
bool out_of_memory_seen() { return g_out_of_memory.load(); }

void fail_check(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": check failed (" + cond +
                      "): " + msg);
}

}  // namespace dtlab
