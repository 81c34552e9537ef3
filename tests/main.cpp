// doctest entry point; each engine module has its own test_<module>.cpp beside this file.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  // The suites compare dtlab-cli runs with the CPU engine: pin --device's default to cpu for every
  // dtlab-cli they start, or a GPU machine would pick cuda. GPU cases ask for cuda by name.
  setenv("DTLAB_DEVICE", "cpu", 0);
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
