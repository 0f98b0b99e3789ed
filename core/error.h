#pragma once
// ag::Error and check(): every user-facing failure in attograd is an ag::Error whose message
// starts with the op's name, e.g.  "matmul: [2,3] @ [4,5]: inner dimensions 3 and 4 differ".
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace ag {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// check(cond, "op: format", args...) throws ag::Error with the formatted message when !cond.
template <class... Args>
inline void check(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) [[unlikely]]
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <class... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ag
