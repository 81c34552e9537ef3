#include "engine/core/check.h"

namespace dtlab {

void fail_check(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": check failed (" + cond +
                      "): " + msg);
}

}  // namespace dtlab
