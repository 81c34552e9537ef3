#include "cli/validators.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace dtlab::cli {

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
          return "'" + text + "' is not a whole number";
        if (v < lo || v > hi)
          return std::to_string(v) + " is out of range; use " + std::to_string(lo) + " to " +
                 std::to_string(hi);
        return "";
      },
      "INT in [" + std::to_string(lo) + ".." + std::to_string(hi) + "]");
}

CLI::Validator real_number(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
          return "'" + text + "' is not a number";
        if (v < lo || v > hi) {
          std::ostringstream os;
          os << text << " is out of range; use " << lo << " to " << hi;
          return os.str();
        }
        return "";
      },
      "NUMBER");
}

CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "an empty path writes nothing; give a file name" : ""; }, "PATH");
}

CLI::Validator existing_path() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        std::error_code ec;
        return std::filesystem::exists(path, ec) ? "" : "'" + path + "' does not exist; check the path";
      },
      "PATH");
}

CLI::Validator existing_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        std::error_code ec;
        if (std::string why = existing_path()(path); !why.empty()) return why;
        if (std::filesystem::is_directory(path, ec))
          return "'" + path + "' is a directory; give a .safetensors file";
        return "";
      },
      "FILE");
}

std::string parse_error_sentence(const CLI::ParseError& e, const std::string& help_command) {
  std::string msg = e.what();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '.')) msg.pop_back();
  return msg + "; run '" + help_command + "' for the list of flags";
}

}  // namespace dtlab::cli
