// The single test binary. Each TEST_CASE is also one CTest entry (doctest_discover_tests).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
