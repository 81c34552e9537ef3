// dtlab-cli driven in-process: the exit code and what it wrote to each stream.
#pragma once
#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace dtlab::test {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline CliResult run_cli(const std::vector<std::string>& args, bool terminal = false) {
  std::ostringstream out, err;
  CliResult r;
  r.code = cli::run_cli(args, {out, err, terminal});
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The CLI's bad-input contract (docs/cli.md, exit codes): exit 2, nothing on stdout, one line on stderr.
inline bool one_sentence_usage_error(const CliResult& r) {
  return r.code == 2 && r.out.empty() && std::count(r.err.begin(), r.err.end(), '\n') == 1;
}

// The dtlab-cli arguments of the headless demo tools/dtlab.sh runs (its `exec "$build/bin/dtlab-cli"`
// line and the lines it continues onto); empty when the script has no such line.
inline std::vector<std::string> quick_start_demo_args() {
  std::ifstream in(std::string(DTLAB_SOURCE_DIR) + "/tools/dtlab.sh");
  const std::string script((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string lead = "exec \"$build/bin/dtlab-cli\" ";
  const size_t at = script.find(lead);
  if (at == std::string::npos) return {};
  std::string command;
  for (size_t i = at + lead.size(); i < script.size(); i++) {
    if (script[i] == '\\' && i + 1 < script.size() && script[i + 1] == '\n') { i++; continue; }
    if (script[i] == '\n') break;
    command += script[i];
  }
  std::vector<std::string> args;
  std::istringstream words(command);
  for (std::string w; words >> w;) args.push_back(w);
  return args;
}

}  // namespace dtlab::test
