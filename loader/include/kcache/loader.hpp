// libkcache_loader's C++ API: header-only, over the C ABI of kcache/loader.h, so it
// exposes no type of the library's internals and works with any C++17 compiler.
//
// Errors are exceptions: every failing call throws kcache::Error, which carries the
// kcache_status and the library's message (kcache_last_error()). Handles are RAII,
// movable, not copyable. Threads: as the C ABI says (Cache, Runtime and Kernel are
// thread-safe; an Entry belongs to one thread at a time).
//
//   kcache::Cache cache("/home/me/.cache/kcache/db");          // or any cache dir
//   kcache::Runtime runtime;                                   // device 0
//   kcache::Kernel add = runtime.kernel(cache, "4fd1c0...");   // session-cached
//   kcache::LaunchConfig config = add.default_config();        // block from signature
//   config.grid[0] = (n + config.block[0] - 1) / config.block[0];
//   add.launch(config, a, b, out, n);  // CUdeviceptr a, b, out; int n: sizes checked
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kcache/loader.h"

namespace kcache {

class Error : public std::runtime_error {
  public:
    Error(kcache_status status, const std::string& message)
        : std::runtime_error(message), m_status(status) {}
    kcache_status status() const noexcept { return m_status; }

  private:
    kcache_status m_status;
};

namespace detail {

inline void check(kcache_status status) {
    if (status != KCACHE_OK) throw Error(status, kcache_last_error());
}

// A unique owner of a C handle freed by `Free`.
template <class T, void (*Free)(T*)>
class Handle {
  public:
    Handle() = default;
    explicit Handle(T* handle) : m_handle(handle) {}
    ~Handle() { Free(m_handle); }
    Handle(Handle&& other) noexcept : m_handle(std::exchange(other.m_handle, nullptr)) {}
    Handle& operator=(Handle&& other) noexcept {
        if (this != &other) {
            Free(m_handle);
            m_handle = std::exchange(other.m_handle, nullptr);
        }
        return *this;
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    T* get() const noexcept { return m_handle; }
    explicit operator bool() const noexcept { return m_handle != nullptr; }

  private:
    T* m_handle = nullptr;
};

}  // namespace detail

using Param = kcache_param;
using LaunchConfig = kcache_launch_config;
using SessionStats = kcache_session_stats;

struct SignatureParam {
    std::string name;
    std::string type;
    std::uint32_t size = 0;
};

// A kernel signature (docs/signature.md): kcache's schema or Triton's metadata.
class Signature {
  public:
    // Parses a signature file's bytes.
    static Signature parse(const std::string& json) {
        kcache_signature* s = nullptr;
        detail::check(kcache_signature_parse(json.data(), json.size(), &s));
        return Signature(s);
    }
    explicit Signature(kcache_signature* owned) : m_handle(owned) {}

    std::string format() const { return kcache_signature_format(get()); }  // "kcache", "triton"
    std::string kernel() const { return kcache_signature_kernel(get()); }
    std::string binary() const { return kcache_signature_binary(get()); }  // "" if not named
    bool has_params() const { return kcache_signature_has_params(get()) != 0; }
    std::vector<SignatureParam> params() const {
        std::vector<SignatureParam> out;
        for (std::size_t i = 0; i < kcache_signature_param_count(get()); ++i) {
            kcache_sig_param p{};
            detail::check(kcache_signature_param(get(), i, &p));
            out.push_back(SignatureParam{p.name, p.type, p.size});
        }
        return out;
    }
    LaunchConfig launch_config() const {  // block and shared memory; grid 1x1x1
        LaunchConfig config{};
        kcache_signature_launch_config(get(), &config);
        return config;
    }
    kcache_signature* get() const noexcept { return m_handle.get(); }

  private:
    detail::Handle<kcache_signature, kcache_signature_free> m_handle;
};

struct Selection {
    std::string file;    // the entry's file
    std::string format;  // "cubin", "fatbin", "ptx"
    std::string arch;    // "sm_90"
    bool jit = false;
    int fatbin_entry = -1;
};

// One cache entry; from a db it holds a read snapshot until destroyed.
class Entry {
  public:
    explicit Entry(kcache_entry* owned) : m_handle(owned) {}

    std::string key() const { return kcache_entry_key(get()); }
    std::vector<std::string> files() const {
        std::vector<std::string> out;
        for (std::size_t i = 0; i < kcache_entry_file_count(get()); ++i) {
            out.emplace_back(kcache_entry_file_name(get(), i));
        }
        return out;
    }
    // The file's bytes (copied; use kcache_entry_read for a view valid while the
    // entry lives).
    std::string read(const std::string& name) {
        const void* data = nullptr;
        std::size_t size = 0;
        detail::check(kcache_entry_read(get(), name.c_str(), &data, &size));
        return std::string(static_cast<const char*>(data), size);
    }
    Selection select_binary(int sm) {
        kcache_selection s{};
        detail::check(kcache_entry_select_binary(get(), sm, &s));
        return Selection{s.file, s.format, s.arch, s.jit != 0, s.fatbin_entry};
    }
    Signature signature() {
        kcache_signature* s = nullptr;
        detail::check(kcache_entry_signature(get(), &s));
        return Signature(s);
    }
    kcache_entry* get() const noexcept { return m_handle.get(); }

  private:
    detail::Handle<kcache_entry, kcache_entry_close> m_handle;
};

// A kcache LMDB db (read-only) or a plain cache directory.
class Cache {
  public:
    explicit Cache(const std::string& path) {
        kcache_cache* c = nullptr;
        detail::check(kcache_cache_open(path.c_str(), &c));
        m_handle = detail::Handle<kcache_cache, kcache_cache_close>(c);
    }
    std::string kind() const { return kcache_cache_kind(get()); }  // "db", "directory"
    std::string path() const { return kcache_cache_path(get()); }
    Entry entry(const std::string& key) const {
        kcache_entry* e = nullptr;
        detail::check(kcache_entry_open(get(), key.c_str(), &e));
        return Entry(e);
    }
    kcache_cache* get() const noexcept { return m_handle.get(); }

  private:
    detail::Handle<kcache_cache, kcache_cache_close> m_handle;
};

// A loaded kernel (a reference; the module stays loaded while one exists).
class Kernel {
  public:
    explicit Kernel(kcache_kernel* owned) : m_handle(owned) {}

    std::string name() const { return kcache_kernel_name(get()); }
    std::string file() const { return kcache_kernel_file(get()); }
    std::vector<Param> params() const {
        std::vector<Param> out;
        for (std::size_t i = 0; i < kcache_kernel_param_count(get()); ++i) {
            Param p{};
            detail::check(kcache_kernel_param(get(), i, &p));
            out.push_back(p);
        }
        return out;
    }
    LaunchConfig default_config() const {
        LaunchConfig config{};
        kcache_kernel_default_config(get(), &config);
        return config;
    }
    // Launches with the arguments' addresses and sizes (sizeof each, so pass
    // arguments of the kernel's exact parameter types: CUdeviceptr or a pointer for
    // a pointer, int for an int). Throws kcache::Error with
    // KCACHE_ERROR_ARGUMENT_MISMATCH, launching nothing, when they do not fit.
    template <class... Args>
    void launch(const LaunchConfig& config, const Args&... args) const {
        // cuLaunchKernel only reads the arguments.
        void* pointers[sizeof...(Args) + 1] = {
            const_cast<void*>(static_cast<const void*>(&args))...};
        const std::size_t sizes[sizeof...(Args) + 1] = {sizeof(Args)...};
        detail::check(kcache_kernel_launch(get(), &config, pointers, sizes, sizeof...(Args)));
    }
    // The C form: args[i] points at sizes[i] bytes.
    void launch(const LaunchConfig& config, void** args, const std::size_t* sizes,
                std::size_t count) const {
        detail::check(kcache_kernel_launch(get(), &config, args, sizes, count));
    }
    kcache_kernel* get() const noexcept { return m_handle.get(); }

  private:
    detail::Handle<kcache_kernel, kcache_kernel_release> m_handle;
};

struct RuntimeOptions {
    std::string driver_library;  // "": $KCACHE_LIBCUDA, else libcuda.so.1
    int device = 0;
    std::size_t cache_capacity = 0;  // 0: 256
};

// The CUDA driver (loaded at run time), one device and a session cache of kernels.
class Runtime {
  public:
    explicit Runtime(const RuntimeOptions& options = {}) {
        kcache_runtime_options o{};
        o.driver_library =
            options.driver_library.empty() ? nullptr : options.driver_library.c_str();
        o.device = options.device;
        o.cache_capacity = options.cache_capacity;
        kcache_runtime* r = nullptr;
        detail::check(kcache_runtime_open(&o, &r));
        m_handle = detail::Handle<kcache_runtime, kcache_runtime_close>(r);
    }
    int sm() const { return kcache_runtime_sm(get()); }
    int driver_version() const { return kcache_runtime_driver_version(get()); }
    SessionStats stats() const {
        SessionStats s{};
        kcache_runtime_stats(get(), &s);
        return s;
    }
    // From the session cache, or loaded from entry `key` of `cache`. `kernel` empty:
    // the signature's kernel, else the binary's only one.
    Kernel kernel(const Cache& cache, const std::string& key, const std::string& kernel = {}) {
        kcache_kernel* k = nullptr;
        detail::check(kcache_runtime_get_kernel(get(), cache.get(), key.c_str(),
                                                kernel.empty() ? nullptr : kernel.c_str(), &k));
        return Kernel(k);
    }
    Kernel load(Entry& entry, const std::string& kernel = {}) {  // bypasses the cache
        kcache_kernel* k = nullptr;
        detail::check(kcache_runtime_load_kernel(get(), entry.get(),
                                                 kernel.empty() ? nullptr : kernel.c_str(), &k));
        return Kernel(k);
    }
    kcache_runtime* get() const noexcept { return m_handle.get(); }

  private:
    detail::Handle<kcache_runtime, kcache_runtime_close> m_handle;
};

}  // namespace kcache
