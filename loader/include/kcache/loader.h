/* libkcache_loader: C ABI (usable from C, Python ctypes, Rust, ...).
 *
 * This part covers offline introspection of GPU binaries (cubin, fatbin, PTX): no
 * GPU, no CUDA driver. Loading and launching come later (docs/loader.md).
 *
 * Conventions:
 *  - Functions that can fail return kcache_status; KCACHE_OK is 0. On failure,
 *    kcache_last_error() returns a message for the calling thread ("cubin: section 12
 *    runs past the end of the file") until that thread's next failing call.
 *  - A kcache_binary is immutable after kcache_inspect() and may be read from many
 *    threads at once; kcache_binary_free() must not race with readers.
 *  - Strings returned by accessors are owned by the kcache_binary they came from and
 *    live as long as it; borrowed handles (kcache_binary_entry_binary) likewise.
 *  - Indices are 0-based; an index out of range is KCACHE_ERROR_OUT_OF_RANGE for
 *    functions returning a status, and NULL / 0 for plain accessors.
 *  - No function throws, aborts or reads past the input it was given.
 */
#ifndef KCACHE_LOADER_H
#define KCACHE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KCACHE_API __attribute__((visibility("default")))
#else
#define KCACHE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kcache_status {
    KCACHE_OK = 0,
    KCACHE_ERROR_INVALID_ARGUMENT = 1, /* a NULL pointer where one is required */
    KCACHE_ERROR_NOT_A_BINARY = 2,     /* not a cubin, fatbin or PTX file */
    KCACHE_ERROR_CORRUPT = 3,          /* a damaged or inconsistent binary */
    KCACHE_ERROR_OUT_OF_MEMORY = 4,
    KCACHE_ERROR_OUT_OF_RANGE = 5,      /* an index past the end */
    KCACHE_ERROR_NOT_FOUND = 6,         /* no kernel of that name */
    KCACHE_ERROR_ARGUMENT_MISMATCH = 7, /* launch arguments do not fit the kernel */
    KCACHE_ERROR_INTERNAL = 8
} kcache_status;

/* The status's name ("KCACHE_ERROR_CORRUPT"); "unknown" for other values. */
KCACHE_API const char* kcache_status_name(kcache_status status);

/* The calling thread's message for its last failing call; "" if none failed yet. */
KCACHE_API const char* kcache_last_error(void);

/* ---- introspection ------------------------------------------------------------- */

typedef struct kcache_binary kcache_binary;

typedef struct kcache_param {
    uint32_t index;
    uint32_t offset; /* in the parameter buffer */
    uint32_t size;   /* bytes */
} kcache_param;

typedef struct kcache_fatbin_entry {
    const char* kind; /* "cubin", "ptx", "ltoir", "unknown" */
    const char* arch; /* "sm_90", "sm_90a", "sm_100f" */
    uint64_t size;    /* payload bytes as stored */
    uint64_t uncompressed_size;
    int compressed;          /* 0 or 1 */
    const char* compression; /* "none", "lz4", "zstd", "unknown" */
    uint32_t container;      /* index of the fatbin container holding it */
    int has_kernels;         /* 1 when its kernels could be read */
} kcache_fatbin_entry;

/* Describes the `size` bytes at `data` (copied: the caller may free them after). On
 * success *out is a new handle for kcache_binary_free. */
KCACHE_API kcache_status kcache_inspect(const void* data, size_t size, kcache_binary** out);
/* NULL is allowed. Borrowed handles must not be freed. */
KCACHE_API void kcache_binary_free(kcache_binary* binary);

KCACHE_API const char* kcache_binary_format(
    const kcache_binary* binary); /* "cubin", "fatbin", "ptx" */
/* "sm_90" for a cubin or PTX; "" for a fatbin (its entries have their own). */
KCACHE_API const char* kcache_binary_arch(const kcache_binary* binary);

/* Kernels of a cubin or PTX (0 for a fatbin itself: see its entries). */
KCACHE_API size_t kcache_binary_kernel_count(const kcache_binary* binary);
KCACHE_API const char* kcache_binary_kernel_name(const kcache_binary* binary, size_t kernel);
KCACHE_API kcache_status kcache_binary_find_kernel(const kcache_binary* binary, const char* name,
                                                   size_t* kernel);
KCACHE_API size_t kcache_binary_param_count(const kcache_binary* binary, size_t kernel);
KCACHE_API kcache_status kcache_binary_param(const kcache_binary* binary, size_t kernel,
                                             size_t param, kcache_param* out);

/* Fatbin entries (0 for a cubin or PTX). */
KCACHE_API size_t kcache_binary_entry_count(const kcache_binary* binary);
KCACHE_API kcache_status kcache_binary_entry(const kcache_binary* binary, size_t entry,
                                             kcache_fatbin_entry* out);
/* A borrowed handle describing the entry's payload as a cubin or PTX binary (format,
 * arch, kernels), owned by `binary`. KCACHE_ERROR_NOT_FOUND when the entry's kernels
 * could not be read (compressed beyond the limit, LTO-IR, unknown kind). */
KCACHE_API kcache_status kcache_binary_entry_binary(const kcache_binary* binary, size_t entry,
                                                    const kcache_binary** out);

/* Checks launch arguments before a launch: `count` sizes, one per parameter, each
 * equal to the parameter's size. KCACHE_ERROR_ARGUMENT_MISMATCH (with a message
 * naming the first mismatch) otherwise. `sizes` may be NULL when count is 0. */
KCACHE_API kcache_status kcache_check_arguments(const kcache_binary* binary, size_t kernel,
                                                const size_t* sizes, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* KCACHE_LOADER_H */
