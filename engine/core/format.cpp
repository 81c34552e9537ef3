#include "engine/core/format.h"

#include <cstdio>
#include <sstream>

namespace dtlab {

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (1 << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else if (b < (int64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); i++) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace dtlab
