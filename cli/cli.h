// dtlab-cli: the headless front end. run_cli() is the whole program minus main(), so tests drive it
// in-process and check exit codes and messages. Exit codes: 0 ok, 1 internal error (or a benchmark
// that found wrong values), 2 bad input (one sentence on err), 3 a collective failed (the watchdog's
// or desync diagnosis on err).
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace dtlab::cli {

struct Streams {
  std::ostream& out;
  std::ostream& err;
  bool terminal = false;  // err is an interactive terminal: draw progress bars
};

int run_cli(const std::vector<std::string>& args, Streams io);  // args exclude argv[0]

// Subcommands (one file each).
}  // namespace dtlab::cli
