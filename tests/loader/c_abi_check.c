/* The C ABI used from C (compiled as C99): kcache/loader.h must be valid C, and this
 * walks every accessor the way a C caller would. test_c_api.cpp calls in here. */
#include <stdio.h>
#include <string.h>

#include "kcache/loader.h"

/* Appends a description of `binary` to `out`: "format arch [kernel(offset:size,...)]...". */
static void describe(const kcache_binary* binary, char* out, size_t out_size) {
    size_t used = strlen(out);
    size_t k;
    used += (size_t)snprintf(out + used, out_size - used, "%s %s", kcache_binary_format(binary),
                             kcache_binary_arch(binary));
    for (k = 0; k < kcache_binary_kernel_count(binary) && used < out_size; ++k) {
        size_t p;
        used += (size_t)snprintf(out + used, out_size - used, " %s(",
                                 kcache_binary_kernel_name(binary, k));
        for (p = 0; p < kcache_binary_param_count(binary, k) && used < out_size; ++p) {
            kcache_param param;
            if (kcache_binary_param(binary, k, p, &param) != KCACHE_OK) return;
            used += (size_t)snprintf(out + used, out_size - used, "%s%u:%u", p ? "," : "",
                                     (unsigned)param.offset, (unsigned)param.size);
        }
        if (used < out_size) used += (size_t)snprintf(out + used, out_size - used, ")");
    }
}

int kcache_c_abi_describe(const void* data, size_t size, char* out, size_t out_size) {
    kcache_binary* binary = NULL;
    kcache_status status;
    size_t e;
    if (out_size == 0) return -1;
    out[0] = '\0';
    status = kcache_inspect(data, size, &binary);
    if (status != KCACHE_OK) {
        snprintf(out, out_size, "%s: %s", kcache_status_name(status), kcache_last_error());
        return (int)status;
    }
    describe(binary, out, out_size);
    for (e = 0; e < kcache_binary_entry_count(binary); ++e) {
        kcache_fatbin_entry entry;
        const kcache_binary* payload = NULL;
        size_t used = strlen(out);
        if (kcache_binary_entry(binary, e, &entry) != KCACHE_OK) break;
        snprintf(out + used, out_size - used, " | entry %u %s %s %s: ", (unsigned)entry.container,
                 entry.kind, entry.arch, entry.compression);
        if (kcache_binary_entry_binary(binary, e, &payload) == KCACHE_OK) {
            describe(payload, out, out_size);
        } else {
            used = strlen(out);
            snprintf(out + used, out_size - used, "(no kernels)");
        }
    }
    kcache_binary_free(binary);
    return 0;
}

/* Describes entry `key` of the cache at `cache_path` for a device of SM `sm`, as a C
 * caller walks it: "KIND KEY: FILES | FILE FORMAT ARCH jit=J | FORMAT KERNEL block=X
 * shared=S params=TYPE:SIZE,...". Returns 0, or the failing status with
 * "STATUS: message" in `out`. */
int kcache_c_abi_entry(const char* cache_path, const char* key, int sm, char* out,
                       size_t out_size) {
    kcache_cache* cache = NULL;
    kcache_entry* entry = NULL;
    kcache_signature* signature = NULL;
    kcache_selection selection;
    kcache_launch_config config;
    kcache_status status;
    size_t used, i;
    if (out_size == 0) return -1;
    out[0] = '\0';
    status = kcache_cache_open(cache_path, &cache);
    if (status == KCACHE_OK) status = kcache_entry_open(cache, key, &entry);
    if (status == KCACHE_OK) {
        used = (size_t)snprintf(out, out_size, "%s %s:", kcache_cache_kind(cache),
                                kcache_entry_key(entry));
        for (i = 0; i < kcache_entry_file_count(entry) && used < out_size; ++i) {
            used += (size_t)snprintf(out + used, out_size - used, " %s",
                                     kcache_entry_file_name(entry, i));
        }
        status = kcache_entry_select_binary(entry, sm, &selection);
    }
    if (status == KCACHE_OK) {
        used = strlen(out);
        snprintf(out + used, out_size - used, " | %s %s %s jit=%d", selection.file,
                 selection.format, selection.arch, selection.jit);
        status = kcache_entry_signature(entry, &signature);
    }
    if (status == KCACHE_OK) {
        kcache_signature_launch_config(signature, &config);
        used = strlen(out);
        used +=
            (size_t)snprintf(out + used, out_size - used, " | %s %s block=%u shared=%u params=",
                             kcache_signature_format(signature), kcache_signature_kernel(signature),
                             (unsigned)config.block[0], (unsigned)config.shared_memory);
        for (i = 0; i < kcache_signature_param_count(signature) && used < out_size; ++i) {
            kcache_sig_param param;
            if (kcache_signature_param(signature, i, &param) != KCACHE_OK) break;
            used += (size_t)snprintf(out + used, out_size - used, "%s%s:%u", i ? "," : "",
                                     param.type, (unsigned)param.size);
        }
    }
    if (status != KCACHE_OK) {
        snprintf(out, out_size, "%s: %s", kcache_status_name(status), kcache_last_error());
    }
    kcache_signature_free(signature);
    kcache_entry_close(entry);
    kcache_cache_close(cache);
    return (int)status;
}
