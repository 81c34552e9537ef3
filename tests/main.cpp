// doctest entry point; each engine module has its own test_<module>.cpp beside this file.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
