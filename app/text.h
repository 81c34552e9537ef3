// Small text helpers the lab's parsers share (lessons, their prose, scripts).
#pragma once
#include <sstream>
#include <string>
#include <vector>

namespace dtlab::app {

// `s` without leading and trailing spaces, tabs and carriage returns.
inline std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// `s` split at runs of whitespace.
inline std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::istringstream is(s);
  for (std::string x; is >> x;) w.push_back(x);
  return w;
}

}  // namespace dtlab::app
