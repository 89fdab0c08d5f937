// Symbolised stack traces for CHECK failures and boundary violations.
#pragma once

#include <string>

namespace kc {

// The calling thread's stack, one frame a line ("  #3 kc::comm::Foo() +0x1c"), innermost
// first, skipping `skip` frames above the caller. Costs microseconds: not for hot paths.
std::string CurrentStackTrace(int skip = 0, int max_frames = 32);

}  // namespace kc
