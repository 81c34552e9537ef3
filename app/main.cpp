// dtlab: the desktop lab. Parses the command line and hands over to the app.
#include <cstdio>
#include <exception>
#include <new>

#include "app/app.h"
#include "engine/io/atomic_file.h"

int main(int argc, char** argv) {
  dtlab::remove_temp_files_on_signal();  // a save interrupted by a signal leaves no temp file
  try {
    dtlab::app::AppOptions options;
    int rc = dtlab::app::parse_app_options(argc, argv, options);
    if (rc < 0) return 0;  // --help, --version
    if (rc != 0) return rc;
    return dtlab::app::run_app(options);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dtlab: out of memory: the run asks for more than this machine has; use a smaller --model, --batch or --world\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlab: internal error: %s\n", e.what());
    return 1;
  }
}
