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
