// Error handling: one exception type and one family of check macros.
//
// The library throws octet::Error; only tools/octet catches, prints one line and exits non-zero.
// Every macro is a single statement (do { } while (0)) and formats its message from any streamable
// arguments, so call sites read `OCTET_CHECK(x.rank() == 2, "input: expected rank 2, got ",
// x.rank())`.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace octet {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& msg)
      : std::runtime_error(msg), file_(file), line_(line) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace octet

#define OCTET_THROW(...) \
  throw ::octet::Error(__FILE__, __LINE__, ::octet::detail::concat(__VA_ARGS__))

#define OCTET_CHECK(cond, ...)  \
  do {                          \
    if (!(cond)) {              \
      OCTET_THROW(__VA_ARGS__); \
    }                           \
  } while (0)
