// KC_CHECK and KC_DCHECK: abort with a message and a stack trace when an invariant breaks.
// Bugs are not errors: never CHECK data that came from peers, users or files (STYLE.md §4).
#pragma once

#include <sstream>

namespace kc::internal_check {

// Collects the message of a failed check; its destructor logs it with a stack trace and
// aborts the process.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
  const char* file_;
  int line_;
};

}  // namespace kc::internal_check

#define KC_PREDICT_TRUE(x) (__builtin_expect(static_cast<bool>(x), 1))

// KC_CHECK(rank < world_size) << "rank=" << rank;
#define KC_CHECK(cond)           \
  switch (0)                     \
  case 0:                        \
  default:                       \
    if (KC_PREDICT_TRUE(cond)) { \
    } else                       \
      ::kc::internal_check::CheckFailure(__FILE__, __LINE__, #cond).stream()

// Checked in debug builds only; for hot paths.
#ifdef NDEBUG
#define KC_DCHECK(cond) \
  while (false) KC_CHECK(cond)
#else
#define KC_DCHECK(cond) KC_CHECK(cond)
#endif
