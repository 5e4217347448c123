// The C ABI for caches, entries, signatures and the CUDA runtime (kcache/loader.h).
// No exception leaves a function here.

#include <cerrno>
#include <memory>
#include <optional>
#include <string>

#include "c_api.hpp"
#include "kcache/loader.h"
#include "kcache/loader/cache.hpp"
#include "kcache/loader/runtime.hpp"
#include "kcache/loader/signature.hpp"

struct kcache_cache {
    std::shared_ptr<kcache::loader::Cache> cache;
};

struct kcache_entry {
    std::unique_ptr<kcache::loader::Entry> entry;
    std::optional<kcache::loader::Selection> selection;  // strings of the last select
    std::string selection_format;
};

struct kcache_signature {
    kcache::loader::Signature signature;
};

struct kcache_runtime {
    std::shared_ptr<kcache::loader::Runtime> runtime;
};

struct kcache_kernel {
    std::shared_ptr<const kcache::loader::Kernel> kernel;
};

namespace {

using kcache::loader::capi::failed;
using kcache::loader::capi::guarded;
namespace kl = kcache::loader;

kcache_status null_argument(const char* what) {
    return failed(KCACHE_ERROR_INVALID_ARGUMENT, std::string(what) + " must not be NULL");
}

void to_config(const kl::LaunchConfig& from, kcache_launch_config* out) {
    for (int i = 0; i < 3; ++i) {
        out->grid[i] = from.grid[static_cast<std::size_t>(i)];
        out->block[i] = from.block[static_cast<std::size_t>(i)];
    }
    out->shared_memory = from.shared_memory;
    out->stream = from.stream;
}

kl::LaunchConfig signature_config(const kl::Signature& s) {
    kl::LaunchConfig config;
    config.block = s.block;
    config.shared_memory = s.shared_memory;
    return config;
}

kcache_status new_kernel(kcache::core::Result<std::shared_ptr<const kl::Kernel>> loaded,
                         kcache_kernel** out) {
    if (!loaded) return failed(loaded.error());
    *out = new kcache_kernel{std::move(*loaded)};
    return KCACHE_OK;
}

}  // namespace

extern "C" {

// ---- caches and entries -------------------------------------------------------------

kcache_status kcache_cache_open(const char* path, kcache_cache** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!path) return null_argument("path");
        auto cache = kl::Cache::open(path);
        if (!cache) return failed(cache.error());
        *out = new kcache_cache{std::move(*cache)};
        return KCACHE_OK;
    });
}

void kcache_cache_close(kcache_cache* cache) {
    delete cache;
}

const char* kcache_cache_kind(const kcache_cache* cache) {
    return cache ? kl::cache_kind_name(cache->cache->kind()).data() : nullptr;
}

const char* kcache_cache_path(const kcache_cache* cache) {
    return cache ? cache->cache->path().c_str() : nullptr;
}

kcache_status kcache_entry_open(const kcache_cache* cache, const char* key, kcache_entry** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!cache || !key) return null_argument("cache and key");
        auto entry = cache->cache->entry(key);
        if (!entry) return failed(entry.error());
        auto handle = std::make_unique<kcache_entry>();
        handle->entry = std::move(*entry);
        *out = handle.release();
        return KCACHE_OK;
    });
}

void kcache_entry_close(kcache_entry* entry) {
    delete entry;
}

const char* kcache_entry_key(const kcache_entry* entry) {
    return entry ? entry->entry->key().c_str() : nullptr;
}

size_t kcache_entry_file_count(const kcache_entry* entry) {
    return entry ? entry->entry->files().size() : 0;
}

const char* kcache_entry_file_name(const kcache_entry* entry, size_t file) {
    if (!entry || file >= entry->entry->files().size()) return nullptr;
    return entry->entry->files()[file].path.c_str();
}

uint64_t kcache_entry_file_size(const kcache_entry* entry, size_t file) {
    if (!entry || file >= entry->entry->files().size()) return 0;
    return entry->entry->files()[file].attr.size;
}

kcache_status kcache_entry_read(kcache_entry* entry, const char* name, const void** data,
                                size_t* size) {
    return guarded([&] {
        if (!entry || !name || !data || !size) return null_argument("entry, name, data and size");
        *data = nullptr;
        *size = 0;
        auto bytes = entry->entry->read(name);
        if (!bytes) return failed(bytes.error());
        *data = bytes->data();
        *size = bytes->size();
        return KCACHE_OK;
    });
}

kcache_status kcache_entry_select_binary(kcache_entry* entry, int sm, kcache_selection* out) {
    return guarded([&] {
        if (!entry || !out) return null_argument("entry and out");
        if (sm <= 0)
            return failed(KCACHE_ERROR_INVALID_ARGUMENT, "sm must be positive (90 for sm_90)");
        auto selection = kl::select_binary(*entry->entry, sm);
        if (!selection) return failed(selection.error());
        entry->selection = std::move(*selection);
        entry->selection_format = std::string(kl::format_name(entry->selection->format));
        out->file = entry->selection->file.c_str();
        out->format = entry->selection_format.c_str();
        out->arch = entry->selection->arch.c_str();
        out->jit = entry->selection->jit ? 1 : 0;
        out->fatbin_entry = entry->selection->fatbin_entry;
        return KCACHE_OK;
    });
}

kcache_status kcache_entry_signature(kcache_entry* entry, kcache_signature** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!entry) return null_argument("entry");
        auto signature = kl::find_signature(*entry->entry);
        if (!signature) return failed(signature.error());
        *out = new kcache_signature{std::move(*signature)};
        return KCACHE_OK;
    });
}

// ---- signatures -------------------------------------------------------------------

kcache_status kcache_signature_parse(const void* json, size_t size, kcache_signature** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!json && size != 0) return null_argument("json");
        auto signature =
            kl::parse_signature(std::string_view(json ? static_cast<const char*>(json) : "", size));
        if (!signature) return failed(signature.error());
        *out = new kcache_signature{std::move(*signature)};
        return KCACHE_OK;
    });
}

void kcache_signature_free(kcache_signature* signature) {
    delete signature;
}

const char* kcache_signature_format(const kcache_signature* s) {
    return s ? kl::signature_format_name(s->signature.format).data() : nullptr;
}

const char* kcache_signature_kernel(const kcache_signature* s) {
    return s ? s->signature.kernel.c_str() : nullptr;
}

const char* kcache_signature_binary(const kcache_signature* s) {
    return s ? s->signature.binary.c_str() : nullptr;
}

int kcache_signature_has_params(const kcache_signature* s) {
    return s && s->signature.params ? 1 : 0;
}

size_t kcache_signature_param_count(const kcache_signature* s) {
    return s && s->signature.params ? s->signature.params->size() : 0;
}

kcache_status kcache_signature_param(const kcache_signature* s, size_t param,
                                     kcache_sig_param* out) {
    return guarded([&] {
        if (!s || !out) return null_argument("signature and out");
        const std::size_t count = s->signature.params ? s->signature.params->size() : 0;
        if (param >= count) {
            return failed(KCACHE_ERROR_OUT_OF_RANGE, "parameter " + std::to_string(param) +
                                                         " out of range (" + std::to_string(count) +
                                                         " parameters)");
        }
        const auto& p = (*s->signature.params)[param];
        *out = kcache_sig_param{p.name.c_str(), p.type.c_str(), p.size};
        return KCACHE_OK;
    });
}

void kcache_signature_launch_config(const kcache_signature* s, kcache_launch_config* out) {
    if (!out) return;
    to_config(s ? signature_config(s->signature) : kl::LaunchConfig{}, out);
}

void kcache_signature_cluster(const kcache_signature* s, uint32_t cluster[3]) {
    if (!cluster) return;
    for (std::size_t i = 0; i < 3; ++i) cluster[i] = s ? s->signature.cluster[i] : 1;
}

// ---- the CUDA runtime ---------------------------------------------------------------

kcache_status kcache_runtime_open(const kcache_runtime_options* options, kcache_runtime** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        kl::RuntimeOptions o;
        if (options) {
            if (options->driver_library) o.driver_library = options->driver_library;
            o.device = options->device;
            o.cache_capacity = options->cache_capacity;
        }
        auto runtime = kl::Runtime::open(o);
        if (!runtime) return failed(runtime.error());
        *out = new kcache_runtime{std::move(*runtime)};
        return KCACHE_OK;
    });
}

void kcache_runtime_close(kcache_runtime* runtime) {
    delete runtime;
}

int kcache_runtime_sm(const kcache_runtime* runtime) {
    return runtime ? runtime->runtime->sm() : 0;
}

int kcache_runtime_driver_version(const kcache_runtime* runtime) {
    return runtime ? runtime->runtime->driver_version() : 0;
}

void kcache_runtime_stats(const kcache_runtime* runtime, kcache_session_stats* out) {
    if (!out) return;
    *out = kcache_session_stats{};
    if (!runtime) return;
    const auto s = runtime->runtime->cache_stats();
    *out = kcache_session_stats{s.hits, s.misses, s.evictions, s.size, s.capacity};
}

kcache_status kcache_runtime_get_kernel(kcache_runtime* runtime, const kcache_cache* cache,
                                        const char* key, const char* kernel, kcache_kernel** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!runtime || !cache || !key) return null_argument("runtime, cache and key");
        return new_kernel(runtime->runtime->kernel(*cache->cache, key, kernel ? kernel : ""), out);
    });
}

kcache_status kcache_runtime_load_kernel(kcache_runtime* runtime, kcache_entry* entry,
                                         const char* kernel, kcache_kernel** out) {
    return guarded([&] {
        if (!out) return null_argument("out");
        *out = nullptr;
        if (!runtime || !entry) return null_argument("runtime and entry");
        return new_kernel(runtime->runtime->load(*entry->entry, kernel ? kernel : ""), out);
    });
}

void kcache_kernel_release(kcache_kernel* kernel) {
    delete kernel;
}

const char* kcache_kernel_name(const kcache_kernel* kernel) {
    return kernel ? kernel->kernel->name().c_str() : nullptr;
}

const char* kcache_kernel_file(const kcache_kernel* kernel) {
    return kernel ? kernel->kernel->file().c_str() : nullptr;
}

size_t kcache_kernel_param_count(const kcache_kernel* kernel) {
    return kernel ? kernel->kernel->info().params.size() : 0;
}

kcache_status kcache_kernel_param(const kcache_kernel* kernel, size_t param, kcache_param* out) {
    return guarded([&] {
        if (!kernel || !out) return null_argument("kernel and out");
        const auto& params = kernel->kernel->info().params;
        if (param >= params.size()) {
            return failed(KCACHE_ERROR_OUT_OF_RANGE,
                          kernel->kernel->name() + ": parameter " + std::to_string(param) +
                              " out of range (" + std::to_string(params.size()) + " parameters)");
        }
        const auto& p = params[param];
        *out = kcache_param{p.index, p.offset, p.size};
        return KCACHE_OK;
    });
}

void kcache_kernel_default_config(const kcache_kernel* kernel, kcache_launch_config* out) {
    if (!out) return;
    to_config(kernel ? kernel->kernel->default_config() : kl::LaunchConfig{}, out);
}

kcache_status kcache_kernel_launch(const kcache_kernel* kernel, const kcache_launch_config* config,
                                   void** args, const size_t* sizes, size_t count) {
    return guarded([&] {
        if (!kernel || !config) return null_argument("kernel and config");
        kl::LaunchConfig c;
        for (std::size_t i = 0; i < 3; ++i) {
            c.grid[i] = config->grid[i];
            c.block[i] = config->block[i];
        }
        c.shared_memory = config->shared_memory;
        c.stream = static_cast<kl::cuda::CUstream>(config->stream);
        auto status = kernel->kernel->launch(c, args, sizes, count);
        if (!status) {
            if (status.error().code == EINVAL) {
                return failed(KCACHE_ERROR_ARGUMENT_MISMATCH, status.error().message);
            }
            return failed(status.error());
        }
        return KCACHE_OK;
    });
}

}  // extern "C"
