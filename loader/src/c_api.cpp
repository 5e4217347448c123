// The C ABI over the C++ API (kcache/loader.h). No exception leaves a function here.

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "c_api.hpp"
#include "kcache/loader.h"
#include "kcache/loader/introspect.hpp"

// The handle: a binary, or a fatbin entry's payload viewed as one (borrowed, owned by
// its parent's `entries`).
struct kcache_binary {
    std::string format;
    std::string arch;
    std::vector<kcache::loader::KernelInfo> kernels;
    std::vector<kcache::loader::FatbinEntry> entries;
    std::vector<std::unique_ptr<kcache_binary>> entry_binaries;  // null: no kernels known
};

namespace kcache::loader::capi {

namespace {
thread_local std::string t_last_error;
}  // namespace

kcache_status failed(kcache_status status, std::string message) {
    try {
        t_last_error = std::move(message);
    } catch (...) {
        t_last_error.clear();
    }
    return status;
}

const char* last_error() {
    return t_last_error.c_str();
}

kcache_status from_errno(int code) {
    switch (code) {
        case ENOEXEC:
            return KCACHE_ERROR_NOT_A_BINARY;
        case EIO:
            return KCACHE_ERROR_CORRUPT;
        case ENOMEM:
            return KCACHE_ERROR_OUT_OF_MEMORY;
        case EINVAL:
        case ERANGE:
            return KCACHE_ERROR_INVALID_ARGUMENT;
        case ENOENT:
            return KCACHE_ERROR_NOT_FOUND;
        case E2BIG:
            return KCACHE_ERROR_OUT_OF_RANGE;
        case ELIBACC:
        case ELIBBAD:
            return KCACHE_ERROR_NO_DRIVER;
        case ENODEV:
            return KCACHE_ERROR_NO_DEVICE;
        case ENXIO:
            return KCACHE_ERROR_NO_BINARY;
        case EBADMSG:
            return KCACHE_ERROR_BAD_PTX;
        case EPROTO:
            return KCACHE_ERROR_DRIVER;
        case ENOTSUP:
            return KCACHE_ERROR_UNSUPPORTED;
        case EACCES:
        case EPERM:
        case ENOTDIR:
        case EISDIR:
        case EROFS:
        case ELOOP:
        case ENAMETOOLONG:
        case EBUSY:
        case EAGAIN:
        case EMFILE:
        case ENFILE:
            return KCACHE_ERROR_IO;
        default:
            return KCACHE_ERROR_INTERNAL;
    }
}

kcache_status failed(const core::Error& error) {
    return failed(from_errno(error.code), error.message);
}

}  // namespace kcache::loader::capi

namespace {

using kcache::loader::BinaryInfo;
using kcache::loader::capi::failed;
using kcache::loader::capi::from_errno;
using kcache::loader::capi::guarded;

std::unique_ptr<kcache_binary> make_handle(BinaryInfo info) {
    auto handle = std::make_unique<kcache_binary>();
    handle->format = std::string(kcache::loader::format_name(info.format));
    handle->arch = std::move(info.arch);
    handle->kernels = std::move(info.kernels);
    handle->entries = std::move(info.entries);
    for (auto& entry : handle->entries) {
        std::unique_ptr<kcache_binary> sub;
        if (entry.kernels) {
            sub = std::make_unique<kcache_binary>();
            sub->format = std::string(kcache::loader::kind_name(entry.kind));
            sub->arch = entry.arch;
            sub->kernels = *entry.kernels;
        }
        handle->entry_binaries.push_back(std::move(sub));
    }
    return handle;
}

const kcache::loader::KernelInfo* kernel_at(const kcache_binary* binary, size_t kernel) {
    if (!binary || kernel >= binary->kernels.size()) return nullptr;
    return &binary->kernels[kernel];
}

kcache_status kernel_out_of_range(const kcache_binary* binary, size_t kernel) {
    if (!binary) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "binary is NULL");
    return failed(KCACHE_ERROR_OUT_OF_RANGE,
                  "kernel " + std::to_string(kernel) + " out of range (" +
                      std::to_string(binary->kernels.size()) + " kernels)");
}

}  // namespace

extern "C" {

const char* kcache_status_name(kcache_status status) {
    switch (status) {
        case KCACHE_OK:
            return "KCACHE_OK";
        case KCACHE_ERROR_INVALID_ARGUMENT:
            return "KCACHE_ERROR_INVALID_ARGUMENT";
        case KCACHE_ERROR_NOT_A_BINARY:
            return "KCACHE_ERROR_NOT_A_BINARY";
        case KCACHE_ERROR_CORRUPT:
            return "KCACHE_ERROR_CORRUPT";
        case KCACHE_ERROR_OUT_OF_MEMORY:
            return "KCACHE_ERROR_OUT_OF_MEMORY";
        case KCACHE_ERROR_OUT_OF_RANGE:
            return "KCACHE_ERROR_OUT_OF_RANGE";
        case KCACHE_ERROR_NOT_FOUND:
            return "KCACHE_ERROR_NOT_FOUND";
        case KCACHE_ERROR_ARGUMENT_MISMATCH:
            return "KCACHE_ERROR_ARGUMENT_MISMATCH";
        case KCACHE_ERROR_INTERNAL:
            return "KCACHE_ERROR_INTERNAL";
        case KCACHE_ERROR_NO_DRIVER:
            return "KCACHE_ERROR_NO_DRIVER";
        case KCACHE_ERROR_NO_DEVICE:
            return "KCACHE_ERROR_NO_DEVICE";
        case KCACHE_ERROR_NO_BINARY:
            return "KCACHE_ERROR_NO_BINARY";
        case KCACHE_ERROR_BAD_PTX:
            return "KCACHE_ERROR_BAD_PTX";
        case KCACHE_ERROR_DRIVER:
            return "KCACHE_ERROR_DRIVER";
        case KCACHE_ERROR_IO:
            return "KCACHE_ERROR_IO";
        case KCACHE_ERROR_UNSUPPORTED:
            return "KCACHE_ERROR_UNSUPPORTED";
    }
    return "unknown";
}

const char* kcache_last_error(void) {
    return kcache::loader::capi::last_error();
}

kcache_status kcache_inspect(const void* data, size_t size, kcache_binary** out) {
    return guarded([&] {
        if (!out) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "out is NULL");
        *out = nullptr;
        if (!data && size != 0) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "data is NULL");
        const std::string_view bytes(data ? static_cast<const char*>(data) : "", size);
        auto info = kcache::loader::inspect(bytes);
        if (!info) return failed(from_errno(info.error().code), info.error().message);
        *out = make_handle(std::move(*info)).release();
        return KCACHE_OK;
    });
}

void kcache_binary_free(kcache_binary* binary) {
    delete binary;
}

const char* kcache_binary_format(const kcache_binary* binary) {
    return binary ? binary->format.c_str() : nullptr;
}

const char* kcache_binary_arch(const kcache_binary* binary) {
    return binary ? binary->arch.c_str() : nullptr;
}

size_t kcache_binary_kernel_count(const kcache_binary* binary) {
    return binary ? binary->kernels.size() : 0;
}

const char* kcache_binary_kernel_name(const kcache_binary* binary, size_t kernel) {
    const auto* k = kernel_at(binary, kernel);
    return k ? k->name.c_str() : nullptr;
}

kcache_status kcache_binary_find_kernel(const kcache_binary* binary, const char* name,
                                        size_t* kernel) {
    return guarded([&] {
        if (!binary || !name || !kernel) {
            return failed(KCACHE_ERROR_INVALID_ARGUMENT,
                          "binary, name and kernel must not be NULL");
        }
        for (size_t i = 0; i < binary->kernels.size(); ++i) {
            if (binary->kernels[i].name == name) {
                *kernel = i;
                return KCACHE_OK;
            }
        }
        return failed(KCACHE_ERROR_NOT_FOUND, std::string("no kernel ") + name);
    });
}

size_t kcache_binary_param_count(const kcache_binary* binary, size_t kernel) {
    const auto* k = kernel_at(binary, kernel);
    return k ? k->params.size() : 0;
}

kcache_status kcache_binary_param(const kcache_binary* binary, size_t kernel, size_t param,
                                  kcache_param* out) {
    return guarded([&] {
        if (!out) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "out is NULL");
        const auto* k = kernel_at(binary, kernel);
        if (!k) return kernel_out_of_range(binary, kernel);
        if (param >= k->params.size()) {
            return failed(KCACHE_ERROR_OUT_OF_RANGE,
                          k->name + ": parameter " + std::to_string(param) + " out of range (" +
                              std::to_string(k->params.size()) + " parameters)");
        }
        const auto& p = k->params[param];
        *out = kcache_param{p.index, p.offset, p.size};
        return KCACHE_OK;
    });
}

size_t kcache_binary_entry_count(const kcache_binary* binary) {
    return binary ? binary->entries.size() : 0;
}

kcache_status kcache_binary_entry(const kcache_binary* binary, size_t entry,
                                  kcache_fatbin_entry* out) {
    return guarded([&] {
        if (!binary || !out) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "binary or out is NULL");
        if (entry >= binary->entries.size()) {
            return failed(KCACHE_ERROR_OUT_OF_RANGE,
                          "entry " + std::to_string(entry) + " out of range (" +
                              std::to_string(binary->entries.size()) + " entries)");
        }
        const auto& e = binary->entries[entry];
        // kind_name and compression_name return views of string literals.
        out->kind = kcache::loader::kind_name(e.kind).data();
        out->arch = e.arch.c_str();
        out->size = e.size;
        out->uncompressed_size = e.uncompressed_size;
        out->compressed = e.compressed ? 1 : 0;
        out->compression = kcache::loader::compression_name(e.compression).data();
        out->container = e.container;
        out->has_kernels = e.kernels ? 1 : 0;
        return KCACHE_OK;
    });
}

kcache_status kcache_binary_entry_binary(const kcache_binary* binary, size_t entry,
                                         const kcache_binary** out) {
    return guarded([&] {
        if (!binary || !out) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "binary or out is NULL");
        *out = nullptr;
        if (entry >= binary->entry_binaries.size()) {
            return failed(KCACHE_ERROR_OUT_OF_RANGE,
                          "entry " + std::to_string(entry) + " out of range (" +
                              std::to_string(binary->entries.size()) + " entries)");
        }
        if (!binary->entry_binaries[entry]) {
            return failed(KCACHE_ERROR_NOT_FOUND,
                          "entry " + std::to_string(entry) + ": its kernels could not be read");
        }
        *out = binary->entry_binaries[entry].get();
        return KCACHE_OK;
    });
}

kcache_status kcache_check_arguments(const kcache_binary* binary, size_t kernel,
                                     const size_t* sizes, size_t count) {
    return guarded([&] {
        if (!sizes && count != 0) return failed(KCACHE_ERROR_INVALID_ARGUMENT, "sizes is NULL");
        const auto* k = kernel_at(binary, kernel);
        if (!k) return kernel_out_of_range(binary, kernel);
        const std::vector<std::size_t> list(sizes, sizes + count);
        auto status = kcache::loader::check_arguments(*k, list);
        if (!status) return failed(KCACHE_ERROR_ARGUMENT_MISMATCH, status.error().message);
        return KCACHE_OK;
    });
}

}  // extern "C"
