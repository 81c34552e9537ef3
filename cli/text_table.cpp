#include "cli/text_table.h"

#include <algorithm>
#include <cstdio>

namespace dtlab::cli {

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                 const std::string& indent) {
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); c++) {
      if (w.size() <= c) w.push_back(0);
      w[c] = std::max(w[c], width(r[c]));
    }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t c = 0; c < r.size(); c++) {
      const std::string pad(w[c] - width(r[c]), ' ');
      line += (c ? "  " : "") + (c < right.size() && right[c] ? pad + r[c] : r[c] + pad);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  }
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

}  // namespace dtlab::cli
