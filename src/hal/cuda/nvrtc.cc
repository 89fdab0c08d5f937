#include "hal/cuda/nvrtc.h"

#include <algorithm>
#include <vector>

#include "hal/cuda/cuda_api.h"

namespace kc::hal::cuda {
namespace {

Status NvrtcError(const NvrtcApi& api, nvrtcResult r, std::string_view what) {
  return InternalError(std::string(what) + ": " + api.nvrtcGetErrorString(r));
}

}  // namespace

Result<CompileTarget> TargetFor(int major, int minor) {
  KC_ASSIGN_OR_RETURN(const NvrtcApi* api, Nvrtc());
  int count = 0;
  if (nvrtcResult r = api->nvrtcGetNumSupportedArchs(&count); r != kNvrtcSuccess) {
    return NvrtcError(*api, r, "nvrtcGetNumSupportedArchs");
  }
  std::vector<int> archs(static_cast<size_t>(std::max(count, 0)));
  if (count > 0) {
    if (nvrtcResult r = api->nvrtcGetSupportedArchs(archs.data()); r != kNvrtcSuccess) {
      return NvrtcError(*api, r, "nvrtcGetSupportedArchs");
    }
  }
  const int want = major * 10 + minor;
  if (std::find(archs.begin(), archs.end(), want) != archs.end()) {
    return CompileTarget{.arch = "sm_" + std::to_string(want), .cubin = true};
  }
  int best = -1;
  for (int a : archs) {
    if (a <= want) best = std::max(best, a);
  }
  if (best < 0) {
    return UnimplementedError("NVRTC knows no architecture at or below sm_" + std::to_string(want) +
                              " (the device's)");
  }
  return CompileTarget{.arch = "compute_" + std::to_string(best), .cubin = false};
}

Result<std::string> Compile(const KernelSource& source, const CompileTarget& target) {
  KC_ASSIGN_OR_RETURN(const NvrtcApi* api, Nvrtc());
  nvrtcProgram program = nullptr;
  const std::string file = source.name + ".cu";
  if (nvrtcResult r =
          api->nvrtcCreateProgram(&program, source.code.c_str(), file.c_str(), 0, nullptr, nullptr);
      r != kNvrtcSuccess) {
    return NvrtcError(*api, r, "nvrtcCreateProgram " + source.name);
  }
  struct Destroy {
    const NvrtcApi* api;
    nvrtcProgram* program;
    ~Destroy() { api->nvrtcDestroyProgram(program); }
  } destroy{api, &program};
  std::vector<std::string> options = {"--gpu-architecture=" + target.arch, "--std=c++17",
                                      "-default-device", "-lineinfo"};
  options.insert(options.end(), source.options.begin(), source.options.end());
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  const nvrtcResult compiled =
      api->nvrtcCompileProgram(program, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  std::string log;
  if (api->nvrtcGetProgramLogSize(program, &log_size) == kNvrtcSuccess && log_size > 1) {
    log.resize(log_size);
    if (api->nvrtcGetProgramLog(program, log.data()) != kNvrtcSuccess) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (compiled != kNvrtcSuccess) {
    return InvalidArgumentError("compile " + source.name + " for " + target.arch + ": " +
                                api->nvrtcGetErrorString(compiled) + "\n" + log);
  }
  size_t size = 0;
  std::string image;
  if (target.cubin) {
    if (nvrtcResult r = api->nvrtcGetCUBINSize(program, &size); r != kNvrtcSuccess) {
      return NvrtcError(*api, r, "nvrtcGetCUBINSize " + source.name);
    }
    image.resize(size);
    if (nvrtcResult r = api->nvrtcGetCUBIN(program, image.data()); r != kNvrtcSuccess) {
      return NvrtcError(*api, r, "nvrtcGetCUBIN " + source.name);
    }
  } else {
    if (nvrtcResult r = api->nvrtcGetPTXSize(program, &size); r != kNvrtcSuccess) {
      return NvrtcError(*api, r, "nvrtcGetPTXSize " + source.name);
    }
    image.resize(size);  // NUL-terminated text: cuModuleLoadData needs the terminator
    if (nvrtcResult r = api->nvrtcGetPTX(program, image.data()); r != kNvrtcSuccess) {
      return NvrtcError(*api, r, "nvrtcGetPTX " + source.name);
    }
  }
  return image;
}

}  // namespace kc::hal::cuda
