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
#pragma once

#include <memory>
#include <string>

#include "kcache/loader/introspect.hpp"

namespace kcache::loader {

namespace cuda {
using CUresult = int;
using CUdevice = int;
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorNotInitialized = 3;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorNoDevice = 100;
}  // namespace cuda

// The entry points resolved from the driver (more are added as the loader grows).
struct DriverApi {
    cuda::CUresult (*init)(unsigned flags) = nullptr;
    cuda::CUresult (*driver_get_version)(int* version) = nullptr;
    cuda::CUresult (*device_get_count)(int* count) = nullptr;
    cuda::CUresult (*get_error_name)(cuda::CUresult error, const char** name) = nullptr;
    cuda::CUresult (*get_error_string)(cuda::CUresult error, const char** text) = nullptr;
};

class KCACHE_LOADER_API Driver {
public:
    // The driver's versioned soname: the unversioned "libcuda.so" is the toolkit's
    // link stub on machines without a driver, so it is never what we ask for.
    static constexpr const char* kLibrary = "libcuda.so.1";

    // Loads and initializes the driver. `library` is for tests and unusual setups.
    // Errors (ENODEV unless said otherwise): no driver library; the stub library;
    // a driver without cuGetProcAddress (older than CUDA 11.3; ENOTSUP); no device.
    static Result<std::shared_ptr<const Driver>> load(const std::string& library = kLibrary);

    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    int version() const { return m_version; }            // e.g. 13000 for CUDA 13.0
    int device_count() const { return m_device_count; }  // at least 1
    const DriverApi& api() const { return m_api; }
    // "CUDA_ERROR_OUT_OF_MEMORY: out of memory", for any result code.
    std::string describe(cuda::CUresult result) const;

private:
    Driver() = default;
    void* m_handle = nullptr;
    DriverApi m_api;
    int m_version = 0;
    int m_device_count = 0;
};

}  // namespace kcache::loader
