#include "kcache/loader/runtime.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kcache::loader {

using core::fail;

class Device {
  public:
    Device(std::shared_ptr<const Driver> driver, cuda::CUdevice device, int ordinal)
        : m_driver(std::move(driver)), m_device(device), m_ordinal(ordinal) {}
    ~Device() {
        if (m_context) m_driver->api().primary_ctx_release(m_device);
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    Status init() {
        const DriverApi& api = m_driver->api();
        int major = 0, minor = 0;
        if (auto rc = api.device_get_attribute(&major, cuda::kAttrComputeCapabilityMajor, m_device);
            rc != cuda::kSuccess) {
            return tl::unexpected(
                m_driver->error(rc, fmt::format("device {}: compute capability", m_ordinal)));
        }
        if (auto rc = api.device_get_attribute(&minor, cuda::kAttrComputeCapabilityMinor, m_device);
            rc != cuda::kSuccess) {
            return tl::unexpected(
                m_driver->error(rc, fmt::format("device {}: compute capability", m_ordinal)));
        }
        m_sm = major * 10 + minor;
        if (auto rc = api.device_get_attribute(&m_max_shared,
                                               cuda::kAttrMaxSharedMemoryPerBlockOptin, m_device);
            rc != cuda::kSuccess) {
            return tl::unexpected(
                m_driver->error(rc, fmt::format("device {}: shared memory size", m_ordinal)));
        }
        if (auto rc = api.primary_ctx_retain(&m_context, m_device); rc != cuda::kSuccess) {
            m_context = nullptr;
            return tl::unexpected(m_driver->error(
                rc, fmt::format("device {}: retaining its primary context", m_ordinal)));
        }
        return {};
    }

    // Makes the primary context current on the calling thread.
    Status make_current() const {
        const DriverApi& api = m_driver->api();
        cuda::CUcontext current = nullptr;
        if (api.ctx_get_current(&current) == cuda::kSuccess && current == m_context) return {};
        if (auto rc = api.ctx_set_current(m_context); rc != cuda::kSuccess) {
            return tl::unexpected(m_driver->error(
                rc, fmt::format("device {}: making its primary context current", m_ordinal)));
        }
        return {};
    }

    const Driver& driver() const { return *m_driver; }
    const DriverApi& api() const { return m_driver->api(); }
    int ordinal() const { return m_ordinal; }
    int sm() const { return m_sm; }
    int max_shared() const { return m_max_shared; }

  private:
    std::shared_ptr<const Driver> m_driver;
    cuda::CUdevice m_device = 0;
    int m_ordinal = 0;
    int m_sm = 0;
    int m_max_shared = 0;
    cuda::CUcontext m_context = nullptr;
};

class Module {
  public:
    Module(std::shared_ptr<const Device> device, cuda::CUmodule module)
        : m_device(std::move(device)), m_module(module) {}
    ~Module() {
        if (m_device->make_current()) m_device->api().module_unload(m_module);
    }
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    const Device& device() const { return *m_device; }
    cuda::CUmodule get() const { return m_module; }

  private:
    std::shared_ptr<const Device> m_device;
    cuda::CUmodule m_module;
};

namespace {

// The image as the driver wants it: PTX NUL-terminated, binaries 8-byte aligned.
// Returns a pointer into `bytes` when that already holds, else into `copy`.
const void* image_of(std::string_view bytes, bool ptx, std::string& copy) {
    if (!ptx && reinterpret_cast<std::uintptr_t>(bytes.data()) % 8 == 0) return bytes.data();
    copy.assign(bytes);  // std::string's storage is NUL-terminated and malloc-aligned
    return copy.c_str();
}

std::string trimmed(const char* log) {
    std::string text(log);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) {
        text.pop_back();
    }
    return text;
}

std::string kernel_names(const std::vector<KernelInfo>& kernels) {
    std::vector<std::string_view> names;
    for (const auto& k : kernels) names.push_back(k.name);
    return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

// The parameters of `name` in the selected code; for a fatbin whose chosen entry
// could not be read, any entry that lists the kernel (layouts agree across archs).
const KernelInfo* find_kernel_info(const Selection& selection, std::string_view name) {
    if (const auto* kernels = selection.kernels()) {
        for (const auto& k : *kernels) {
            if (k.name == name) return &k;
        }
        return nullptr;
    }
    for (const auto& entry : selection.info.entries) {
        if (!entry.kernels) continue;
        for (const auto& k : *entry.kernels) {
            if (k.name == name) return &k;
        }
    }
    return nullptr;
}

}  // namespace

// ---- Kernel ---------------------------------------------------------------------------

Kernel::~Kernel() = default;

LaunchConfig Kernel::default_config() const {
    LaunchConfig config;
    if (m_signature) {
        config.block = m_signature->block;
        config.shared_memory = m_signature->shared_memory;
    }
    return config;
}

Status Kernel::opt_in_shared_memory(std::uint32_t bytes) const {
    const Device& device = m_module->device();
    if (device.max_shared() > 0 && bytes > static_cast<std::uint32_t>(device.max_shared())) {
        return fail(ERANGE, fmt::format("{}: {} bytes of dynamic shared memory asked for, the "
                                        "device allows at most {} per block",
                                        name(), bytes, device.max_shared()));
    }
    if (auto s = device.make_current(); !s) return s;
    const auto rc = device.api().func_set_attribute(
        m_function, cuda::kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(bytes));
    if (rc != cuda::kSuccess) {
        return tl::unexpected(device.driver().error(
            rc, fmt::format("{}: opting in to {} bytes of dynamic shared memory", name(), bytes)));
    }
    std::uint32_t seen = m_shared_opt_in.load(std::memory_order_relaxed);
    while (seen < bytes && !m_shared_opt_in.compare_exchange_weak(seen, bytes)) {
    }
    return {};
}

Status Kernel::launch(const LaunchConfig& config, void** args, const std::size_t* sizes,
                      std::size_t count) const {
    const auto& params = m_info.params;
    bool fits = count == params.size() && (count == 0 || (args && sizes));
    for (std::size_t i = 0; fits && i < count; ++i) fits = sizes[i] == params[i].size;
    if (!fits) {
        if (count != 0 && (!args || !sizes)) {
            return fail(EINVAL, fmt::format("{}: {} arguments but no argument or size list", name(),
                                            count));
        }
        if (auto s = check_arguments(m_info, std::vector<std::size_t>(sizes, sizes + count)); !s) {
            return s;
        }
    }
    if (config.shared_memory > m_shared_opt_in.load(std::memory_order_relaxed)) {
        if (auto s = opt_in_shared_memory(config.shared_memory); !s) return s;
    }
    const Device& device = m_module->device();
    if (auto s = device.make_current(); !s) return s;
    const auto rc = device.api().launch_kernel(m_function, config.grid[0], config.grid[1],
                                               config.grid[2], config.block[0], config.block[1],
                                               config.block[2], config.shared_memory, config.stream,
                                               count ? args : nullptr, nullptr);
    if (rc != cuda::kSuccess) {
        return tl::unexpected(device.driver().error(
            rc, fmt::format("launching {} (grid {}x{}x{}, block {}x{}x{}, {} bytes of shared "
                            "memory)",
                            name(), config.grid[0], config.grid[1], config.grid[2], config.block[0],
                            config.block[1], config.block[2], config.shared_memory)));
    }
    return {};
}

// ---- Runtime --------------------------------------------------------------------------

Runtime::~Runtime() = default;

Result<std::shared_ptr<Runtime>> Runtime::open(const RuntimeOptions& options) {
    auto driver = KCACHE_TRY(Driver::load(options.driver_library));
    const Driver& d = *driver;
    if (options.device < 0 || options.device >= d.device_count()) {
        return fail(ENODEV, fmt::format("no CUDA device {} (the driver found {})", options.device,
                                        d.device_count()));
    }
    cuda::CUdevice handle = 0;
    if (auto rc = d.api().device_get(&handle, options.device); rc != cuda::kSuccess) {
        return tl::unexpected(d.error(rc, fmt::format("device {}", options.device)));
    }
    auto device = std::make_shared<Device>(driver, handle, options.device);
    KCACHE_TRY(device->init());
    std::shared_ptr<Runtime> runtime(
        new Runtime(options.cache_capacity ? options.cache_capacity : 256));
    runtime->m_device = std::move(device);
    return runtime;
}

int Runtime::device() const {
    return m_device->ordinal();
}

int Runtime::sm() const {
    return m_device->sm();
}

int Runtime::driver_version() const {
    return m_device->driver().version();
}

Result<std::shared_ptr<const Kernel>> Runtime::kernel(const Cache& cache, std::string_view key,
                                                      std::string_view kernel) {
    // One key per thread, reused: a hit allocates nothing.
    thread_local KernelKey t_key;
    t_key.entry.assign(cache.path());
    t_key.entry.push_back('\0');
    t_key.entry.append(key);
    t_key.kernel.assign(kernel);
    t_key.device = m_device->ordinal();
    if (auto hit = m_cache.find(t_key)) return hit;
    auto entry = KCACHE_TRY(cache.entry(key));
    auto loaded = load(*entry, kernel);
    if (!loaded) return loaded;
    return m_cache.insert(t_key, std::move(*loaded));
}

namespace {

// What a failed module load says beyond the driver's error: the JIT's log, and for a JIT
// the PTX ISA version against the driver's CUDA version.
std::string load_failure_detail(const Selection& selection, const Driver& driver,
                                const char* error_log) {
    std::string detail = trimmed(error_log);
    if (selection.jit) {
        const std::string ptx_version =
            !selection.info.ptx_version.empty()
                ? selection.info.ptx_version
                : (selection.fatbin_entry >= 0
                       ? selection.info.entries[static_cast<std::size_t>(selection.fatbin_entry)]
                             .ptx_version
                       : std::string());
        const std::string versions = fmt::format(
            "PTX ISA {}, driver for CUDA {}.{}", ptx_version.empty() ? "?" : ptx_version,
            driver.version() / 1000, driver.version() % 1000 / 10);
        detail = detail.empty() ? versions : versions + "; JIT log: " + detail;
    }
    return detail;
}

}  // namespace

Result<std::shared_ptr<const Kernel>> Runtime::load(Entry& entry, std::string_view requested) {
    std::optional<Signature> signature;
    if (auto found = find_signature(entry); found) {
        if (requested.empty() || found->kernel == requested) signature = std::move(*found);
    } else if (found.error().code != ENOENT) {
        return tl::unexpected(found.error());
    }
    auto selection = KCACHE_TRY(
        select_binary(entry, m_device->sm(), signature ? std::string_view(signature->binary) : ""));

    std::string name(requested);
    if (name.empty() && signature) name = signature->kernel;
    if (name.empty()) {
        const auto* kernels = selection.kernels();
        if (!kernels || kernels->size() != 1) {
            return fail(EINVAL, fmt::format("entry {}: name a kernel: {} has {} ({}) and no "
                                            "signature names one",
                                            entry.key(), selection.file,
                                            kernels ? fmt::format("{} kernels", kernels->size())
                                                    : std::string("unreadable kernels"),
                                            kernels ? kernel_names(*kernels) : "?"));
        }
        name = kernels->front().name;
    }
    const KernelInfo* info = find_kernel_info(selection, name);
    if (!info) {
        const auto* kernels = selection.kernels();
        return fail(ENOENT, fmt::format("entry {}: {} has no kernel {} (it has: {})", entry.key(),
                                        selection.file, name,
                                        kernels ? kernel_names(*kernels) : "unreadable kernels"));
    }

    auto bytes = KCACHE_TRY(entry.read(selection.file));
    const bool ptx = selection.format == Format::ptx;
    std::string copy;
    const void* image = image_of(bytes, ptx, copy);
    char error_log[8192] = {};
    cuda::CUjit_option options[] = {cuda::kJitErrorLogBuffer, cuda::kJitErrorLogBufferSizeBytes};
    void* values[] = {error_log, reinterpret_cast<void*>(std::uintptr_t{sizeof error_log})};
    KCACHE_TRY(m_device->make_current());
    const DriverApi& api = m_device->api();
    const Driver& driver = m_device->driver();
    cuda::CUmodule handle = nullptr;
    const std::string what =
        fmt::format("entry {}: loading {} ({} for {}{}) on device {} (sm_{})", entry.key(),
                    selection.file, format_name(selection.format), selection.arch,
                    selection.jit ? ", JIT" : "", m_device->ordinal(), m_device->sm());
    if (auto rc = api.module_load_data_ex(&handle, image, 2, options, values);
        rc != cuda::kSuccess) {
        return tl::unexpected(
            driver.error(rc, what, load_failure_detail(selection, driver, error_log)));
    }
    auto module = std::make_shared<const Module>(m_device, handle);

    std::shared_ptr<Kernel> kernel(new Kernel());
    kernel->m_module = module;
    kernel->m_info = *info;
    kernel->m_signature = std::move(signature);
    kernel->m_file = selection.file;
    if (auto rc = api.module_get_function(&kernel->m_function, handle, name.c_str());
        rc != cuda::kSuccess) {
        return tl::unexpected(driver.error(rc, fmt::format("entry {}: looking up kernel {} in {}",
                                                           entry.key(), name, selection.file)));
    }
    if (kernel->m_signature && kernel->m_signature->shared_memory > kDefaultSharedMemoryLimit) {
        KCACHE_TRY(kernel->opt_in_shared_memory(kernel->m_signature->shared_memory));
    }
    return std::shared_ptr<const Kernel>(std::move(kernel));
}

}  // namespace kcache::loader
