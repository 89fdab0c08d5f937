// Compiling CUDA C++ at run time with NVRTC (loaded by hal/cuda/cuda_api.h).
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "hal/runtime_kernels.h"

namespace kc::hal::cuda {

// What to compile for: a real architecture ("sm_90": a CUBIN the driver loads as it is) or a
// virtual one ("compute_90": PTX, which the driver compiles when it loads it).
struct CompileTarget {
  std::string arch;
  bool cubin = false;
};

// The target for a device of compute capability major.minor: its own sm_XY when NVRTC knows
// it, else PTX for the newest architecture NVRTC knows below it. kNotFound without NVRTC;
// kUnimplemented when NVRTC knows no architecture at or below the device's.
Result<CompileTarget> TargetFor(int major, int minor);

// The compiled image (CUBIN bytes or PTX text) of `source` for `target`. kInvalidArgument with
// the compiler's log when it does not compile; kNotFound without NVRTC.
Result<std::string> Compile(const KernelSource& source, const CompileTarget& target);

}  // namespace kc::hal::cuda
