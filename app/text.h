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

// The number written at `t[i]` as prose writes one, "1,500.5" or "1.5" (a ',' or '.' counts only
// between digits, so "4547." ending a sentence is 4547), with its commas dropped; `end` is where it
// stops. The caller checks that `t[i]` is a digit.
inline std::string number_at(const std::string& t, size_t i, size_t& end) {
  auto digit = [&](size_t k) { return k < t.size() && t[k] >= '0' && t[k] <= '9'; };
  std::string n;
  for (end = i; digit(end) || (end < t.size() && (t[end] == ',' || t[end] == '.') && digit(end + 1)); end++)
    if (t[end] != ',') n += t[end];
  return n;
}

}  // namespace dtlab::app
