// dtlab: the desktop lab. Parses the command line and hands over to the app.
#include "app/app.h"

int main(int argc, char** argv) {
  dtlab::app::AppOptions options;
  int rc = dtlab::app::parse_app_options(argc, argv, options);
  if (rc < 0) return 0;  // --help, --version
  if (rc != 0) return rc;
  return dtlab::app::run_app(options);
}
