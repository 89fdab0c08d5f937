#include "base/check.h"

#include <cstdlib>
#include <string>

#include "base/log.h"
#include "base/stacktrace.h"

namespace kc::internal_check {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "Check failed: " << condition << " ";
  file_ = file;
  line_ = line;
}

CheckFailure::~CheckFailure() {
  std::string text = stream_.str() + "\n" + CurrentStackTrace(1);
  log::internal::Emit(log::Severity::kFatal, file_, line_, text);
  std::abort();
}

}  // namespace kc::internal_check
