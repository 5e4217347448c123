// Loading kernels from cache entries onto a CUDA device and launching them.
//
// A Runtime is one device of the loaded driver, its primary context (retained while
// the Runtime or any kernel loaded through it lives) and a session cache of loaded
// kernels keyed by (cache and entry, kernel name, device). Runtime::kernel() is the
// per-call path: a hit is one hash lookup under a mutex; a miss opens the entry,
// selects the binary for the device (select_binary), reads the signature
// (find_signature), loads the module (cuModuleLoadDataEx: cubin, fatbin, or PTX
// compiled by the driver's JIT, with its error log in the message) and looks the
// kernel up. Dynamic shared memory above 48 KiB is opted in with cuFuncSetAttribute
// when the signature or a launch asks for it.
//
// Threads: a Runtime and its Kernels are thread-safe. Every call makes the primary
// context current on the calling thread when it is not.
//
// Errors: as Driver (driver.hpp) and Cache (cache.hpp); EINVAL for arguments that do
// not fit the kernel, refused before cuLaunchKernel.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kcache/loader/cache.hpp"
#include "kcache/loader/driver.hpp"
#include "kcache/loader/session_cache.hpp"
#include "kcache/loader/signature.hpp"

namespace kcache::loader {

struct RuntimeOptions {
    std::string driver_library;        // "": Driver::default_library()
    int device = 0;                    // CUDA device ordinal
    std::size_t cache_capacity = 256;  // loaded kernels kept (0: 256)
};

// Dynamic shared memory a kernel may use without opting in.
inline constexpr std::uint32_t kDefaultSharedMemoryLimit = 48 * 1024;

struct LaunchConfig {
    std::array<std::uint32_t, 3> grid{1, 1, 1};
    std::array<std::uint32_t, 3> block{1, 1, 1};
    std::uint32_t shared_memory = 0;  // dynamic shared memory, bytes
    cuda::CUstream stream = nullptr;  // null: the legacy default stream
};

class Device;  // the driver, device and primary context (runtime.cpp)
class Module;  // a loaded module, unloaded when its last kernel goes

class KCACHE_LOADER_API Kernel {
  public:
    ~Kernel();
    Kernel(const Kernel&) = delete;
    Kernel& operator=(const Kernel&) = delete;

    const std::string& name() const { return m_info.name; }
    const KernelInfo& info() const { return m_info; }  // its parameters
    const std::optional<Signature>& signature() const { return m_signature; }
    const std::string& file() const { return m_file; }  // the entry's file loaded
    // Block and dynamic shared memory from the signature (grid 1x1x1, default stream).
    LaunchConfig default_config() const;

    // Checks the arguments against info() (one per parameter, `sizes[i]` bytes at
    // `args[i]`), opts in to config.shared_memory above 48 KiB if needed, and calls
    // cuLaunchKernel. EINVAL, before anything reaches the driver, for a wrong
    // argument list.
    Status launch(const LaunchConfig& config, void** args, const std::size_t* sizes,
                  std::size_t count) const;

  private:
    friend class Runtime;
    Kernel() = default;
    Status opt_in_shared_memory(std::uint32_t bytes) const;

    std::shared_ptr<const Module> m_module;
    cuda::CUfunction m_function = nullptr;
    KernelInfo m_info;
    std::optional<Signature> m_signature;
    std::string m_file;
    mutable std::atomic<std::uint32_t> m_shared_opt_in{kDefaultSharedMemoryLimit};
};

class KCACHE_LOADER_API Runtime {
  public:
    // Loads the driver, gets the device and retains its primary context.
    static Result<std::shared_ptr<Runtime>> open(const RuntimeOptions& options = {});
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    int device() const;  // the ordinal
    int sm() const;      // compute capability as a number: 90 for 9.0
    int driver_version() const;

    // The kernel `kernel` of entry `key` of `cache`, from the session cache or loaded.
    // `kernel` empty: the signature's kernel, else the binary's only kernel.
    Result<std::shared_ptr<const Kernel>> kernel(const Cache& cache, std::string_view key,
                                                 std::string_view kernel = {});
    // Loads from an open entry, bypassing the session cache.
    Result<std::shared_ptr<const Kernel>> load(Entry& entry, std::string_view kernel = {});

    SessionCacheStats cache_stats() const { return m_cache.stats(); }

  private:
    explicit Runtime(std::size_t capacity) : m_cache(capacity) {}
    std::shared_ptr<const Device> m_device;
    SessionCache<Kernel> m_cache;
};

}  // namespace kcache::loader
