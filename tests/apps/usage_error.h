#pragma once
// Shared by the apps' tests: checks that f() raises an apps::UsageError (exit code 2) whose message
// is one line holding each of `parts`.
#include <doctest/doctest.h>

#include <initializer_list>
#include <string>

#include "apps/common/run.h"

template <class F>
void check_usage_error(F&& f, std::initializer_list<const char*> parts) {
  std::string m;
  try {
    f();
  } catch (const ag::apps::UsageError& e) {
    m = e.what();
  }
  INFO("message: " << m);
  CHECK(!m.empty());
  CHECK(m.find('\n') == std::string::npos);
  for (const char* p : parts) CHECK_MESSAGE(m.find(p) != std::string::npos, p);
}
