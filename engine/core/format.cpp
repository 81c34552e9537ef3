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

std::string si_text(double v, const char* unit) {
  static const char* const prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  double x = v;
  while (i < 6 && (x >= 999.5 || x <= -999.5)) x /= 1000, i++;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s%s", x >= 99.95 || x <= -99.95 || x == 0 ? 0 : x >= 9.995 || x <= -9.995 ? 1 : 2, x,
                prefixes[i], unit);
  return buf;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : std::string(sep)) + item;
  return out;
}

std::string index_span(int64_t begin, int64_t end) {
  return end - begin == 1 ? std::to_string(begin) : std::to_string(begin) + "-" + std::to_string(end - 1);
}

std::string choice_list(const std::vector<std::string>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); i++)
    s += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return s;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string rank_runs_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i + 1;
    while (j < ranks.size() && ranks[j] == ranks[j - 1] + 1) j++;
    s += (i ? ", " : "") + std::to_string(ranks[i]);
    if (j - i >= 3) s += "-" + std::to_string(ranks[j - 1]), i = j;
    else i++;
  }
  return s;
}

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (2 to 4 bytes), or 0.
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; k++)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string tidy_sentence(const std::string& msg) {
  // Escape what a terminal would not print as text.
  std::string clean;
  for (size_t i = 0; i < msg.size();) {
    const auto b = static_cast<unsigned char>(msg[i]);
    if ((b >= 0x20 && b < 0x7F) || b == '\n') {  // a message may carry lines of its own (a schedule's grid)
      clean += msg[i++];
    } else if (size_t n = b >= 0x80 ? utf8_length(msg, i) : 0) {
      clean.append(msg, i, n);
      i += n;
    } else {
      static const char* hex = "0123456789abcdef";
      clean += "\\x";
      clean += hex[b >> 4];
      clean += hex[b & 15];
      i++;
    }
  }
  // Shorten long words: the sentence around them is what the reader needs.
  std::string out;
  for (size_t i = 0; i < clean.size();) {
    const size_t end = std::min(clean.find_first_of(" \n", i), clean.size());
    if (end - i > 120) out += clean.substr(i, 80) + "..." + clean.substr(end - 20, 20);
    else out.append(clean, i, end - i);
    if (end < clean.size()) out += clean[end];
    i = end + 1;
  }
  if (out.size() > 2000) out = out.substr(0, 1980) + " ... (cut)";
  return out;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); i++) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string trim_blanks(std::string_view text) {
  const auto b = text.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  const auto e = text.find_last_not_of(" \t");
  return std::string(text.substr(b, e - b + 1));
}

}  // namespace dtlab
