#include "cli/validators.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

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

namespace {

// CLI11's message without its final newline and period; its counts of a flag's values in words
// ("--cp: At Most 1 required but received 2": the flag given twice; "--cp: 1 required INT missing":
// no value after it).
std::string parse_error_words(const CLI::ParseError& e) {
  std::string msg = e.what();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '.')) msg.pop_back();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) == nullptr) return msg;
  const size_t colon = msg.find(": ");
  if (colon == std::string::npos || msg.rfind("-", 0) != 0) return msg;
  const std::string flag = msg.substr(0, colon), rest = msg.substr(colon + 2);
  const std::string at_most = "At Most 1 required but received ";
  if (rest.rfind(at_most, 0) == 0) return flag + " is given " + rest.substr(at_most.size()) + " times; give it once";
  if (rest.rfind("1 required ", 0) == 0 && rest.size() > 8 && rest.compare(rest.size() - 8, 8, " missing") == 0)
    return flag + " needs a value after it";
  return msg;
}

}  // namespace

std::string parse_error_sentence(const CLI::ParseError& e, const std::string& help_command) {
  return parse_error_words(e) + "; run '" + help_command + "' for the list of flags";
}

namespace {

// Edit distance with adjacent swaps counted once (optimal string alignment): "--stpes" is one swap
// from "--steps".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); i++) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); j++) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); i++)
    for (size_t j = 1; j <= b.size(); j++) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string closest_word(const std::string& word, const std::vector<std::string>& options) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& o : options) {
    // One name inside the other ("batchsize" for batch, "world-size" for world) is a typo too.
    const bool inside = o.size() > 2 && word.size() > 2 && (word.rfind(o, 0) == 0 || o.rfind(word, 0) == 0);
    if (const size_t d = inside ? 1 : edit_distance(word, o); d < best_d) best = o, best_d = d;
  }
  // Close: at most a third of the letters wrong (a typo, not another word).
  return best_d <= std::max<size_t>(1, word.size() / 3) ? best : "";
}

std::string unknown_flag_text(const CLI::ParseError& e, const std::vector<std::string>& args, const CLI::App& cmd) {
  if (std::string text = unknown_flag(args, cmd); !text.empty()) return text;
  return parse_error_words(e);
}

std::string unknown_flag(const std::vector<std::string>& args, const CLI::App& cmd) {
  std::vector<std::string> known;  // long names, without "--"
  for (const CLI::Option* o : cmd.get_options())
    for (const std::string& n : o->get_lnames()) known.push_back(n);
  // A subcommand's flags come after its name; the window's (no parent) anywhere.
  bool mine = cmd.get_parent() == nullptr;
  for (const std::string& a : args) {
    if (a == "--") break;  // launch: what follows is the command it starts
    if (a == cmd.get_name()) mine = true;
    if (!mine || a.size() < 3 || a.rfind("--", 0) != 0) continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::string near = closest_word(name, known);
    return "--" + name + " is not a flag" + (near.empty() ? "" : " (did you mean --" + near + "?)");
  }
  return "";
}

}  // namespace dtlab::cli
