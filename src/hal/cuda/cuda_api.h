// The CUDA libraries the CUDA backend calls, loaded at run time with dlopen: the driver
// (libcuda.so.1), NVRTC (run-time compilation) and cuBLAS. Only the declarations used are
// written out here, with the values of NVIDIA's headers (cuda.h, nvrtc.h, cublas_api.h,
// library_types.h; part of their stable ABI), so CUDA is never a build dependency and a host
// without it simply has no CUDA device. Each library is loaded once per process and stays.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kc::hal::cuda {

// --- Driver API (cuda.h) ---------------------------------------------------------------
using CUresult = int;  // enum cudaError_enum
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 on 64-bit hosts
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUhostFn = void (*)(void* user_data);

constexpr CUresult kCudaSuccess = 0;          // CUDA_SUCCESS
constexpr CUresult kCudaErrorNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
constexpr CUresult kCudaErrorNotReady = 600;  // CUDA_ERROR_NOT_READY
constexpr unsigned kStreamNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING
constexpr int kFuncAttrMaxDynamicShared = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kAttrMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedPerBlockOptin =
    97;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN

struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuGetErrorName)(CUresult error, const char** name);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice device);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);  // _v2
  CUresult (*cuCtxSetCurrent)(CUcontext context);
  CUresult (*cuCtxGetCurrent)(CUcontext* context);
  CUresult (*cuMemGetInfo)(size_t* free_bytes, size_t* total_bytes);  // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes);             // _v2
  CUresult (*cuMemFree)(CUdeviceptr ptr);                             // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes,
                                CUstream stream);  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes,
                                CUstream stream);  // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                CUstream stream);  // _v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream);
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream stream);  // _v2
  CUresult (*cuStreamQuery)(CUstream stream);
  CUresult (*cuLaunchHostFunc)(CUstream stream, CUhostFn fn, void* user_data);
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction* function, CUmodule module, const char* name);
  CUresult (*cuFuncSetAttribute)(CUfunction function, int attribute, int value);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                             unsigned block_x, unsigned block_y, unsigned block_z,
                             unsigned shared_bytes, CUstream stream, void** params, void** extra);
};

// --- NVRTC (nvrtc.h) -------------------------------------------------------------------
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;
constexpr nvrtcResult kNvrtcSuccess = 0;

struct NvrtcApi {
  const char* (*nvrtcGetErrorString)(nvrtcResult result);
  nvrtcResult (*nvrtcVersion)(int* major, int* minor);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int* count);
  nvrtcResult (*nvrtcGetSupportedArchs)(int* archs);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram* program, const char* source, const char* name,
                                    int num_headers, const char* const* headers,
                                    const char* const* include_names);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram* program);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram program, int num_options,
                                     const char* const* options);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram program, size_t* size);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram program, char* log);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram program, size_t* size);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram program, char* ptx);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram program, size_t* size);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram program, char* cubin);
};

// --- cuBLAS (cublas_api.h, library_types.h) --------------------------------------------
using cublasStatus_t = int;
using cublasHandle_t = struct cublasContext*;
constexpr cublasStatus_t kCublasSuccess = 0;  // CUBLAS_STATUS_SUCCESS
constexpr int kCublasOpN = 0;                 // CUBLAS_OP_N
constexpr int kCublasOpT = 1;                 // CUBLAS_OP_T
constexpr int kCublasDefaultMath = 0;         // CUBLAS_DEFAULT_MATH: fp32 stays fp32
constexpr int kCudaR32F = 0;                  // CUDA_R_32F
constexpr int kCudaR16BF = 14;                // CUDA_R_16BF
constexpr int kCublasCompute32F = 68;         // CUBLAS_COMPUTE_32F
constexpr int kCublasGemmDefault = -1;        // CUBLAS_GEMM_DEFAULT

struct CublasApi {
  cublasStatus_t (*cublasCreate)(cublasHandle_t* handle);                     // _v2
  cublasStatus_t (*cublasDestroy)(cublasHandle_t handle);                     // _v2
  cublasStatus_t (*cublasSetStream)(cublasHandle_t handle, CUstream stream);  // _v2
  cublasStatus_t (*cublasSetMathMode)(cublasHandle_t handle, int mode);
  cublasStatus_t (*cublasSgemmStridedBatched)(cublasHandle_t handle, int transa, int transb, int m,
                                              int n, int k, const float* alpha, const float* a,
                                              int lda, long long stride_a, const float* b, int ldb,
                                              long long stride_b, const float* beta, float* c,
                                              int ldc, long long stride_c, int batch_count);
  cublasStatus_t (*cublasGemmStridedBatchedEx)(cublasHandle_t handle, int transa, int transb, int m,
                                               int n, int k, const void* alpha, const void* a,
                                               int a_type, int lda, long long stride_a,
                                               const void* b, int b_type, int ldb,
                                               long long stride_b, const void* beta, void* c,
                                               int c_type, int ldc, long long stride_c,
                                               int batch_count, int compute_type, int algo);
  const char* (*cublasGetStatusString)(cublasStatus_t status);  // may be null (old cuBLAS)
};

// The loaded libraries, or why not: kNotFound when the library (or a symbol it must have)
// cannot be loaded, naming every file tried; for the driver also when cuInit reports no
// device; kUnavailable when cuInit fails otherwise. Safe for concurrent use; loads once.
Result<const DriverApi*> Driver();
Result<const NvrtcApi*> Nvrtc();
Result<const CublasApi*> Cublas();

// "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)".
std::string DriverErrorText(CUresult result);

// A Status for a failed driver call: `what` and the error text. Out of memory is
// kResourceExhausted; a call on a device whose context a fault has broken (illegal address,
// launch failure, a trap), kInternal; anything else kUnavailable.
Status DriverError(CUresult result, std::string_view what);
Status CublasError(cublasStatus_t status, std::string_view what);

}  // namespace kc::hal::cuda
