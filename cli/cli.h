// dtlab-cli: the headless front end. run_cli() is the whole program minus main(), so tests drive it
// in-process and check exit codes and messages. Exit codes: 0 ok, 1 internal error (or a benchmark
// that found wrong values), 2 bad input (one sentence on err), 3 a collective failed (the watchdog's
// or desync diagnosis on err).
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace dtlab::cli {

// What run_cli does with arguments that parse. Run runs them. The checks run nothing and return 0
// when the arguments are accepted (tests check the commands README shows this way):
// CheckFlags stops once CLI11 accepts every flag and value; CheckConfig also makes the checks a run
// makes before its first step (train builds its Trainer, launch checks its own flags and the flags
// of the command it would start); the other subcommands stop where CheckFlags does.
enum class Mode { Run, CheckFlags, CheckConfig };

struct Streams {
  std::ostream& out;
  std::ostream& err;
  bool terminal = false;  // err is an interactive terminal: draw progress bars
  Mode mode = Mode::Run;
};

int run_cli(const std::vector<std::string>& args, Streams io);  // args exclude argv[0]

// Subcommands (one file each).
}  // namespace dtlab::cli
