// dtlab-cli entry point: everything lives in run_cli() (cli/cli.cpp).
#include <unistd.h>

#include <iostream>

#include "cli/cli.h"
#include "engine/core/check.h"
#include "engine/io/atomic_file.h"

int main(int argc, char** argv) {
  dtlab::remove_temp_files_on_signal();  // Ctrl-C during --save leaves no temp file behind
  std::vector<std::string> args(argv + 1, argv + argc);
  const int rc = dtlab::cli::run_cli(args, {std::cout, std::cerr, isatty(STDERR_FILENO) == 1});
  if (dtlab::out_of_memory_seen()) {  // OpenBLAS's exit handler would wait forever (engine/core/check.h)
    std::cout.flush();
    std::cerr.flush();
    std::_Exit(rc);
  }
  return rc;
}
