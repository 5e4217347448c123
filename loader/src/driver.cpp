#include "kcache/loader/driver.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

namespace kcache::loader {
namespace {

// cuGetProcAddress as CUDA 12+ exports it (the _v2 symbol adds the status argument).
using GetProcAddressV2 = cuda::CUresult (*)(const char* symbol, void** pfn, int cuda_version,
                                            unsigned long long flags, int* status);
using GetProcAddressV1 = cuda::CUresult (*)(const char* symbol, void** pfn, int cuda_version,
                                            unsigned long long flags);
constexpr int kApiVersion = 12000;  // the entry points' versions this code expects

template <class Fn>
Fn symbol(void* handle, const char* name) {
    return reinterpret_cast<Fn>(dlsym(handle, name));
}

int errno_of(cuda::CUresult result) {
    switch (result) {
        case cuda::kErrorOutOfMemory:
            return ENOMEM;
        case cuda::kErrorNoDevice:
        case cuda::kErrorNotInitialized:
            return ENODEV;
        case cuda::kErrorStubLibrary:
            return ELIBBAD;
        case cuda::kErrorNoBinaryForGpu:
        case cuda::kErrorInvalidImage:
            return ENXIO;
        case cuda::kErrorInvalidPtx:
        case cuda::kErrorUnsupportedPtxVersion:
        case cuda::kErrorJitCompilerNotFound:
        case cuda::kErrorJitCompilationDisabled:
            return EBADMSG;
        case cuda::kErrorNotFound:
            return ENOENT;
        default:
            return EPROTO;
    }
}

}  // namespace

Driver::~Driver() {
    if (m_handle) dlclose(m_handle);
}

std::string Driver::default_library() {
    const char* env = std::getenv("KCACHE_LIBCUDA");
    return env && *env ? std::string(env) : std::string(kLibrary);
}

Result<std::shared_ptr<const Driver>> Driver::load(const std::string& requested) {
    const std::string library = requested.empty() ? default_library() : requested;
    std::shared_ptr<Driver> driver(new Driver());
    driver->m_library = library;
    driver->m_handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!driver->m_handle) {
        const char* why = dlerror();
        return core::fail(ELIBACC, fmt::format("no NVIDIA driver: cannot load {} ({})", library,
                                               why ? why : "not found"));
    }
    // Resolve cuGetProcAddress by symbol, everything else through it.
    auto get_v2 = symbol<GetProcAddressV2>(driver->m_handle, "cuGetProcAddress_v2");
    auto get_v1 = symbol<GetProcAddressV1>(driver->m_handle, "cuGetProcAddress");
    if (!get_v2 && !get_v1) {
        return core::fail(
            ELIBBAD, fmt::format("the CUDA driver in {} is too old: it has no cuGetProcAddress "
                                 "(CUDA 11.3 or newer is needed)",
                                 library));
    }
    // The toolkit's stub answers every call, cuGetProcAddress included, with this.
    const auto stub = [&] {
        return core::fail(ELIBBAD,
                          fmt::format("{} is the CUDA toolkit's stub library, not a driver (is "
                                      "LD_LIBRARY_PATH pointing at .../lib64/stubs?)",
                                      library));
    };
    auto resolve = [&](const char* name, auto& slot) -> Status {
        void* fn = nullptr;
        int status = 0;
        const cuda::CUresult rc =
            get_v2 ? get_v2(name, &fn, kApiVersion, 0, &status) : get_v1(name, &fn, kApiVersion, 0);
        if (rc == cuda::kErrorStubLibrary) return stub();
        if (rc != cuda::kSuccess || !fn) {
            return core::fail(ELIBBAD, fmt::format("the CUDA driver in {} has no {} (error {})",
                                                   library, name, rc));
        }
        slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(fn);
        return {};
    };
    DriverApi& api = driver->m_api;
    for (auto s :
         {resolve("cuInit", api.init), resolve("cuDriverGetVersion", api.driver_get_version),
          resolve("cuDeviceGetCount", api.device_get_count),
          resolve("cuGetErrorName", api.get_error_name),
          resolve("cuGetErrorString", api.get_error_string), resolve("cuDeviceGet", api.device_get),
          resolve("cuDeviceGetAttribute", api.device_get_attribute),
          resolve("cuDevicePrimaryCtxRetain", api.primary_ctx_retain),
          resolve("cuDevicePrimaryCtxRelease", api.primary_ctx_release),
          resolve("cuCtxGetCurrent", api.ctx_get_current),
          resolve("cuCtxSetCurrent", api.ctx_set_current),
          resolve("cuModuleLoadDataEx", api.module_load_data_ex),
          resolve("cuModuleUnload", api.module_unload),
          resolve("cuModuleGetFunction", api.module_get_function),
          resolve("cuFuncSetAttribute", api.func_set_attribute),
          resolve("cuLaunchKernel", api.launch_kernel)}) {
        KCACHE_TRY(s);
    }
    const cuda::CUresult init = api.init(0);
    if (init == cuda::kErrorStubLibrary) return stub();
    if (init == cuda::kErrorNoDevice) return core::fail(ENODEV, "the CUDA driver found no device");
    if (init != cuda::kSuccess) {
        return core::fail(
            ENODEV, fmt::format("the CUDA driver failed to start: {}", driver->describe(init)));
    }
    if (const auto rc = api.driver_get_version(&driver->m_version); rc != cuda::kSuccess) {
        return tl::unexpected(driver->error(rc, "cuDriverGetVersion"));
    }
    if (const auto rc = api.device_get_count(&driver->m_device_count); rc != cuda::kSuccess) {
        return tl::unexpected(driver->error(rc, "cuDeviceGetCount"));
    }
    if (driver->m_device_count == 0) return core::fail(ENODEV, "the CUDA driver found no device");
    return std::shared_ptr<const Driver>(std::move(driver));
}

std::string Driver::describe(cuda::CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (m_api.get_error_name) m_api.get_error_name(result, &name);
    if (m_api.get_error_string) m_api.get_error_string(result, &text);
    if (!name) return fmt::format("CUDA error {}", result);
    return text ? fmt::format("{}: {}", name, text) : std::string(name);
}

Error Driver::error(cuda::CUresult result, const std::string& what,
                    const std::string& detail) const {
    std::string message = fmt::format("{}: {}", what, describe(result));
    if (!detail.empty()) message += fmt::format(" ({})", detail);
    return Error{errno_of(result), std::move(message)};
}

}  // namespace kcache::loader
