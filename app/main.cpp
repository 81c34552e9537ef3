// dtlab: the desktop lab. Parses the command line and hands over to the app.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "app/app.h"
#include "engine/core/check.h"
#include "engine/io/atomic_file.h"

namespace {

// After an allocation failed anywhere (a rank's, or here), OpenBLAS's exit handler would wait
// forever for its worker threads (engine/core/check.h): end without the exit handlers.
int finish(int rc) {
  if (dtlab::out_of_memory_seen()) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  dtlab::remove_temp_files_on_signal();  // a save interrupted by a signal leaves no temp file
  try {
    dtlab::app::AppOptions options;
    int rc = dtlab::app::parse_app_options(argc, argv, options);
    if (rc < 0) return 0;  // --help, --version
    if (rc != 0) return rc;
    return finish(dtlab::app::run_app(options));
  } catch (const std::bad_alloc&) {
    dtlab::mark_out_of_memory();
    std::fprintf(stderr, "dtlab: out of memory: the run asks for more than this machine has; use a smaller --model, --batch or --world\n");
    return finish(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlab: internal error: %s\n", e.what());
    return finish(1);
  }
}
