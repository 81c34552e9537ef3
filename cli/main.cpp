// dtlab-cli entry point: everything lives in run_cli() (cli/cli.cpp).
#include <unistd.h>

#include <iostream>

#include "cli/cli.h"
#include "engine/io/atomic_file.h"

int main(int argc, char** argv) {
  dtlab::remove_temp_files_on_signal();  // Ctrl-C during --save leaves no temp file behind
  std::vector<std::string> args(argv + 1, argv + argc);
  return dtlab::cli::run_cli(args, {std::cout, std::cerr, isatty(STDERR_FILENO) == 1});
}
