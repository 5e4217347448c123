// The CUDA driver, loaded at run time.
//
// libkcache_loader has no link-time dependency on libcuda: introspection and
// everything else that needs no GPU work on machines without a driver. Driver::load()
// opens the driver by its versioned name, resolves every entry point through
// cuGetProcAddress (so the API versions are the ones this code was written for), and
// initializes it. What it reports when that cannot be done names the cause: no driver
// installed, the toolkit's link stub loaded instead of the driver, a driver too old,
// no device.
//
// The few driver API types used here are declared below, binary-compatible with
// cuda.h, so building kcache never needs the CUDA toolkit's headers.
//
// Error codes (errno values in core::Error, mapped to kcache_status by the C ABI):
//   ELIBACC  no driver library could be loaded
//   ELIBBAD  the library is the toolkit's stub, or a driver older than CUDA 11.3
//   ENODEV   the driver failed to start or found no device
//   ENXIO    no binary for this GPU (CUDA_ERROR_NO_BINARY_FOR_GPU, INVALID_IMAGE)
//   EBADMSG  PTX the driver cannot compile: invalid, or newer than the driver
//   ENOMEM   out of GPU memory
//   ENOENT   no such kernel in a loaded module
//   EPROTO   any other driver failure (the message carries the driver's error name)
#pragma once

#include <memory>
#include <string>

#include "kcache/loader/introspect.hpp"

namespace kcache::loader {

namespace cuda {
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUjit_option = int;
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorInvalidValue = 1;
inline constexpr CUresult kErrorOutOfMemory = 2;
inline constexpr CUresult kErrorNotInitialized = 3;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorNoDevice = 100;
inline constexpr CUresult kErrorInvalidImage = 200;
inline constexpr CUresult kErrorNoBinaryForGpu = 209;
inline constexpr CUresult kErrorInvalidPtx = 218;
inline constexpr CUresult kErrorJitCompilerNotFound = 221;
inline constexpr CUresult kErrorUnsupportedPtxVersion = 222;
inline constexpr CUresult kErrorJitCompilationDisabled = 223;
inline constexpr CUresult kErrorNotFound = 500;
inline constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_...
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
inline constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_...
inline constexpr CUjit_option kJitInfoLogBuffer = 3;          // CU_JIT_...
inline constexpr CUjit_option kJitInfoLogBufferSizeBytes = 4;
inline constexpr CUjit_option kJitErrorLogBuffer = 5;
inline constexpr CUjit_option kJitErrorLogBufferSizeBytes = 6;
}  // namespace cuda

// The entry points resolved from the driver.
struct DriverApi {
    using CUresult = cuda::CUresult;
    CUresult (*init)(unsigned flags) = nullptr;
    CUresult (*driver_get_version)(int* version) = nullptr;
    CUresult (*device_get_count)(int* count) = nullptr;
    CUresult (*get_error_name)(CUresult error, const char** name) = nullptr;
    CUresult (*get_error_string)(CUresult error, const char** text) = nullptr;
    CUresult (*device_get)(cuda::CUdevice* device, int ordinal) = nullptr;
    CUresult (*device_get_attribute)(int* value, int attribute, cuda::CUdevice device) = nullptr;
    CUresult (*primary_ctx_retain)(cuda::CUcontext* context, cuda::CUdevice device) = nullptr;
    CUresult (*primary_ctx_release)(cuda::CUdevice device) = nullptr;
    CUresult (*ctx_get_current)(cuda::CUcontext* context) = nullptr;
    CUresult (*ctx_set_current)(cuda::CUcontext context) = nullptr;
    CUresult (*module_load_data_ex)(cuda::CUmodule* module, const void* image, unsigned count,
                                    cuda::CUjit_option* options, void** values) = nullptr;
    CUresult (*module_unload)(cuda::CUmodule module) = nullptr;
    CUresult (*module_get_function)(cuda::CUfunction* function, cuda::CUmodule module,
                                    const char* name) = nullptr;
    CUresult (*func_set_attribute)(cuda::CUfunction function, int attribute, int value) = nullptr;
    CUresult (*launch_kernel)(cuda::CUfunction function, unsigned grid_x, unsigned grid_y,
                              unsigned grid_z, unsigned block_x, unsigned block_y, unsigned block_z,
                              unsigned shared_bytes, cuda::CUstream stream, void** params,
                              void** extra) = nullptr;
};

class KCACHE_LOADER_API Driver {
  public:
    // The driver's versioned soname: the unversioned "libcuda.so" is the toolkit's
    // link stub on machines without a driver, so it is never what we ask for.
    static constexpr const char* kLibrary = "libcuda.so.1";
    // $KCACHE_LIBCUDA when set (tests, unusual installs), else kLibrary.
    static std::string default_library();

    // Loads and initializes the driver; `library` empty means default_library().
    // Errors: see the file comment (ELIBACC, ELIBBAD, ENODEV).
    static Result<std::shared_ptr<const Driver>> load(const std::string& library = {});

    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    const std::string& library() const { return m_library; }
    int version() const { return m_version; }            // e.g. 13000 for CUDA 13.0
    int device_count() const { return m_device_count; }  // at least 1
    const DriverApi& api() const { return m_api; }
    // "CUDA_ERROR_OUT_OF_MEMORY: out of memory", for any result code.
    std::string describe(cuda::CUresult result) const;
    // An Error for a failed call: the errno of the file comment for `result`, and
    // "<what>: <describe(result)>" (plus `detail` when not empty) as the message.
    Error error(cuda::CUresult result, const std::string& what,
                const std::string& detail = {}) const;

  private:
    Driver() = default;
    void* m_handle = nullptr;
    std::string m_library;
    DriverApi m_api;
    int m_version = 0;
    int m_device_count = 0;
};

}  // namespace kcache::loader
