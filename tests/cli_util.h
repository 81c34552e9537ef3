// dtlab-cli driven in-process: the exit code and what it wrote to each stream.
#pragma once
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

}  // namespace dtlab::test
