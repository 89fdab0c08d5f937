#include "hal/cuda/cuda_api.h"

#include <dlfcn.h>

#include <initializer_list>
#include <mutex>
#include <utility>

namespace kc::hal::cuda {
namespace {

// The first of `names` dlopen finds (the loader's own search: LD_LIBRARY_PATH, the cache,
// RUNPATHs), or kNotFound naming every one tried with dlopen's reason for the last.
Result<void*> OpenFirst(std::initializer_list<const char*> names, std::string_view what) {
  std::string tried;
  std::string last_error;
  for (const char* name : names) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
    if (!tried.empty()) tried += ", ";
    tried += name;
    if (const char* e = dlerror()) last_error = e;
  }
  return NotFoundError(std::string(what) + " was not found (tried " + tried + "; " + last_error +
                       "); on a GPU machine, put the directory that holds it on LD_LIBRARY_PATH");
}

// Resolves `name` into `*fn`; a missing symbol appends to `*missing`.
template <typename Fn>
void Bind(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
  }
}

// One library's load, done once: the table, or why it could not be had.
template <typename Api>
struct Loaded {
  std::once_flag once;
  Api api{};
  Status status;
};

Loaded<DriverApi>& DriverSlot() {
  static auto* slot = new Loaded<DriverApi>;  // never destroyed: callbacks may run at exit
  return *slot;
}
Loaded<NvrtcApi>& NvrtcSlot() {
  static auto* slot = new Loaded<NvrtcApi>;
  return *slot;
}
Loaded<CublasApi>& CublasSlot() {
  static auto* slot = new Loaded<CublasApi>;
  return *slot;
}

Status LoadDriver(DriverApi* api) {
  KC_ASSIGN_OR_RETURN(void* lib, OpenFirst({"libcuda.so.1", "libcuda.so"}, "the CUDA driver"));
  std::string missing;
  Bind(lib, "cuInit", &api->cuInit, &missing);
  Bind(lib, "cuGetErrorName", &api->cuGetErrorName, &missing);
  Bind(lib, "cuGetErrorString", &api->cuGetErrorString, &missing);
  Bind(lib, "cuDeviceGetCount", &api->cuDeviceGetCount, &missing);
  Bind(lib, "cuDeviceGet", &api->cuDeviceGet, &missing);
  Bind(lib, "cuDeviceGetName", &api->cuDeviceGetName, &missing);
  Bind(lib, "cuDeviceGetAttribute", &api->cuDeviceGetAttribute, &missing);
  Bind(lib, "cuDevicePrimaryCtxRetain", &api->cuDevicePrimaryCtxRetain, &missing);
  Bind(lib, "cuDevicePrimaryCtxRelease_v2", &api->cuDevicePrimaryCtxRelease, &missing);
  Bind(lib, "cuCtxSetCurrent", &api->cuCtxSetCurrent, &missing);
  Bind(lib, "cuCtxGetCurrent", &api->cuCtxGetCurrent, &missing);
  Bind(lib, "cuMemGetInfo_v2", &api->cuMemGetInfo, &missing);
  Bind(lib, "cuMemAlloc_v2", &api->cuMemAlloc, &missing);
  Bind(lib, "cuMemFree_v2", &api->cuMemFree, &missing);
  Bind(lib, "cuMemcpyHtoDAsync_v2", &api->cuMemcpyHtoDAsync, &missing);
  Bind(lib, "cuMemcpyDtoHAsync_v2", &api->cuMemcpyDtoHAsync, &missing);
  Bind(lib, "cuMemcpyDtoDAsync_v2", &api->cuMemcpyDtoDAsync, &missing);
  Bind(lib, "cuMemsetD8Async", &api->cuMemsetD8Async, &missing);
  Bind(lib, "cuStreamCreate", &api->cuStreamCreate, &missing);
  Bind(lib, "cuStreamDestroy_v2", &api->cuStreamDestroy, &missing);
  Bind(lib, "cuStreamQuery", &api->cuStreamQuery, &missing);
  Bind(lib, "cuLaunchHostFunc", &api->cuLaunchHostFunc, &missing);
  Bind(lib, "cuModuleLoadData", &api->cuModuleLoadData, &missing);
  Bind(lib, "cuModuleUnload", &api->cuModuleUnload, &missing);
  Bind(lib, "cuModuleGetFunction", &api->cuModuleGetFunction, &missing);
  Bind(lib, "cuFuncSetAttribute", &api->cuFuncSetAttribute, &missing);
  Bind(lib, "cuLaunchKernel", &api->cuLaunchKernel, &missing);
  if (!missing.empty()) {
    return NotFoundError("the CUDA driver (libcuda.so.1) lacks " + missing +
                         " (a driver for CUDA 11.1 or newer is needed)");
  }
  const CUresult r = api->cuInit(0);
  if (r == kCudaErrorNoDevice) return NotFoundError("cuInit: no CUDA device on this host");
  if (r != kCudaSuccess) return UnavailableError("cuInit failed: " + DriverErrorText(r));
  return OkStatus();
}

Status LoadNvrtc(NvrtcApi* api) {
  KC_ASSIGN_OR_RETURN(void* lib, OpenFirst({"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
                                           "NVRTC (libnvrtc.so)"));
  std::string missing;
  Bind(lib, "nvrtcGetErrorString", &api->nvrtcGetErrorString, &missing);
  Bind(lib, "nvrtcVersion", &api->nvrtcVersion, &missing);
  Bind(lib, "nvrtcGetNumSupportedArchs", &api->nvrtcGetNumSupportedArchs, &missing);
  Bind(lib, "nvrtcGetSupportedArchs", &api->nvrtcGetSupportedArchs, &missing);
  Bind(lib, "nvrtcCreateProgram", &api->nvrtcCreateProgram, &missing);
  Bind(lib, "nvrtcDestroyProgram", &api->nvrtcDestroyProgram, &missing);
  Bind(lib, "nvrtcCompileProgram", &api->nvrtcCompileProgram, &missing);
  Bind(lib, "nvrtcGetProgramLogSize", &api->nvrtcGetProgramLogSize, &missing);
  Bind(lib, "nvrtcGetProgramLog", &api->nvrtcGetProgramLog, &missing);
  Bind(lib, "nvrtcGetPTXSize", &api->nvrtcGetPTXSize, &missing);
  Bind(lib, "nvrtcGetPTX", &api->nvrtcGetPTX, &missing);
  Bind(lib, "nvrtcGetCUBINSize", &api->nvrtcGetCUBINSize, &missing);
  Bind(lib, "nvrtcGetCUBIN", &api->nvrtcGetCUBIN, &missing);
  if (!missing.empty()) {
    return NotFoundError("NVRTC lacks " + missing + " (NVRTC of CUDA 11.2 or newer is needed)");
  }
  return OkStatus();
}

Status LoadCublas(CublasApi* api) {
  KC_ASSIGN_OR_RETURN(void* lib, OpenFirst({"libcublas.so.13", "libcublas.so.12", "libcublas.so"},
                                           "cuBLAS (libcublas.so)"));
  std::string missing;
  Bind(lib, "cublasCreate_v2", &api->cublasCreate, &missing);
  Bind(lib, "cublasDestroy_v2", &api->cublasDestroy, &missing);
  Bind(lib, "cublasSetStream_v2", &api->cublasSetStream, &missing);
  Bind(lib, "cublasSetMathMode", &api->cublasSetMathMode, &missing);
  Bind(lib, "cublasSgemmStridedBatched", &api->cublasSgemmStridedBatched, &missing);
  Bind(lib, "cublasGemmStridedBatchedEx", &api->cublasGemmStridedBatchedEx, &missing);
  if (!missing.empty()) return NotFoundError("cuBLAS lacks " + missing);
  api->cublasGetStatusString =
      reinterpret_cast<decltype(api->cublasGetStatusString)>(dlsym(lib, "cublasGetStatusString"));
  return OkStatus();
}

template <typename Api>
Result<const Api*> Get(Loaded<Api>& slot, Status (*load)(Api*)) {
  std::call_once(slot.once, [&] { slot.status = load(&slot.api); });
  if (!slot.status.ok()) return slot.status;
  return &slot.api;
}

}  // namespace

Result<const DriverApi*> Driver() { return Get(DriverSlot(), &LoadDriver); }
Result<const NvrtcApi*> Nvrtc() { return Get(NvrtcSlot(), &LoadNvrtc); }
Result<const CublasApi*> Cublas() { return Get(CublasSlot(), &LoadCublas); }

std::string DriverErrorText(CUresult result) {
  const DriverApi& api = DriverSlot().api;  // set before any call that can fail
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName != nullptr) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString != nullptr) api.cuGetErrorString(result, &text);
  std::string out = name != nullptr ? name : "CUresult " + std::to_string(result);
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

Status DriverError(CUresult result, std::string_view what) {
  const std::string message = std::string(what) + ": " + DriverErrorText(result);
  switch (result) {
    case 2:  // CUDA_ERROR_OUT_OF_MEMORY
      return ResourceExhaustedError(message);
    case 700:  // CUDA_ERROR_ILLEGAL_ADDRESS
    case 710:  // CUDA_ERROR_ASSERT
    case 714:  // CUDA_ERROR_HARDWARE_STACK_ERROR
    case 715:  // CUDA_ERROR_ILLEGAL_INSTRUCTION
    case 716:  // CUDA_ERROR_MISALIGNED_ADDRESS
    case 717:  // CUDA_ERROR_INVALID_ADDRESS_SPACE
    case 718:  // CUDA_ERROR_INVALID_PC
    case 719:  // CUDA_ERROR_LAUNCH_FAILED
      return InternalError(message + "; the device's context is unusable from now on");
    default:
      return UnavailableError(message);
  }
}

Status CublasError(cublasStatus_t status, std::string_view what) {
  const CublasApi& api = CublasSlot().api;
  std::string text = "cublasStatus " + std::to_string(status);
  if (api.cublasGetStatusString != nullptr) {
    if (const char* s = api.cublasGetStatusString(status)) text = s;
  }
  const std::string message = std::string(what) + ": " + text;
  if (status == 3) return ResourceExhaustedError(message);  // CUBLAS_STATUS_ALLOC_FAILED
  if (status == 7) return InvalidArgumentError(message);    // CUBLAS_STATUS_INVALID_VALUE
  if (status == 15) return UnimplementedError(message);     // CUBLAS_STATUS_NOT_SUPPORTED
  return InternalError(message);
}

}  // namespace kc::hal::cuda
