/* libkcache_loader: C ABI (usable from C, Python ctypes, Rust, ...). docs/loader.md.
 *
 *  - Introspection of GPU binaries (cubin, fatbin, PTX): no GPU, no CUDA driver.
 *  - Caches and entries: a kcache LMDB db or any plain cache directory; an entry's
 *    files, the binary for an SM, its signature (docs/signature.md). No GPU needed.
 *  - The CUDA runtime: the driver loaded at run time (never linked), kernels loaded
 *    from entries into a session cache, launched with their arguments checked.
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
    KCACHE_ERROR_INVALID_ARGUMENT = 1,  /* a NULL pointer where one is required, a bad key */
    KCACHE_ERROR_NOT_A_BINARY = 2,      /* not a cubin, fatbin or PTX file */
    KCACHE_ERROR_CORRUPT = 3,           /* a damaged binary, signature or db */
    KCACHE_ERROR_OUT_OF_MEMORY = 4,     /* host memory, or GPU memory in the runtime */
    KCACHE_ERROR_OUT_OF_RANGE = 5,      /* an index past the end, an entry too large */
    KCACHE_ERROR_NOT_FOUND = 6,         /* no such kernel, cache, entry, file, signature */
    KCACHE_ERROR_ARGUMENT_MISMATCH = 7, /* launch arguments do not fit the kernel */
    KCACHE_ERROR_INTERNAL = 8,
    KCACHE_ERROR_NO_DRIVER = 9,   /* no CUDA driver: none installed, the toolkit's stub, too old */
    KCACHE_ERROR_NO_DEVICE = 10,  /* the driver found no (such) device or failed to start */
    KCACHE_ERROR_NO_BINARY = 11,  /* the entry has no binary this GPU can run */
    KCACHE_ERROR_BAD_PTX = 12,    /* PTX the driver cannot compile: invalid or too new */
    KCACHE_ERROR_DRIVER = 13,     /* any other driver failure (the message names it) */
    KCACHE_ERROR_IO = 14,         /* reading the cache failed (permissions, ...) */
    KCACHE_ERROR_UNSUPPORTED = 15 /* a format version newer than this library */
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

/* ---- caches and entries ---------------------------------------------------------- */

typedef struct kcache_cache kcache_cache;
typedef struct kcache_entry kcache_entry;
typedef struct kcache_signature kcache_signature;

/* Opens a cache: a directory holding data.mdb is a kcache LMDB db, read directly in
 * read-only snapshots (never created or written); any other directory is a plain
 * cache directory (the kcache mount, ~/.triton/cache, ~/.wave). A kcache_cache is
 * thread-safe. KCACHE_ERROR_NOT_FOUND when `path` does not exist. */
KCACHE_API kcache_status kcache_cache_open(const char* path, kcache_cache** out);
/* NULL is allowed. Entries and kernels opened from it keep what they need alive. */
KCACHE_API void kcache_cache_close(kcache_cache* cache);
KCACHE_API const char* kcache_cache_kind(const kcache_cache* cache); /* "db", "directory" */
KCACHE_API const char* kcache_cache_path(const kcache_cache* cache); /* absolute */

/* Opens the entry `key`: its path below the cache's root (Triton's or Wave's kernel
 * hash directory, or a flat file). Its files are the regular files below it (tmp.*
 * directories left out), in name order. A kcache_entry is used by one thread at a
 * time; from a db it holds a read snapshot until closed, so close it soon.
 * KCACHE_ERROR_NOT_FOUND for no such entry, KCACHE_ERROR_INVALID_ARGUMENT for a key
 * that is empty, absolute or holds "." or "..". */
KCACHE_API kcache_status kcache_entry_open(const kcache_cache* cache, const char* key,
                                           kcache_entry** out);
KCACHE_API void kcache_entry_close(kcache_entry* entry); /* NULL is allowed */
KCACHE_API const char* kcache_entry_key(const kcache_entry* entry);
KCACHE_API size_t kcache_entry_file_count(const kcache_entry* entry);
/* "kernel.cubin" (relative to the entry); NULL out of range. */
KCACHE_API const char* kcache_entry_file_name(const kcache_entry* entry, size_t file);
KCACHE_API uint64_t kcache_entry_file_size(const kcache_entry* entry, size_t file);
/* The content of file `name`, owned by the entry and valid until it is closed. From a
 * db, content stored uncompressed in one page points into the map (zero-copy). */
KCACHE_API kcache_status kcache_entry_read(kcache_entry* entry, const char* name, const void** data,
                                           size_t* size);

/* The binary chosen for an SM (90 for sm_90 / compute capability 9.0): a cubin for
 * the SM (exact before compatible: same major, lower minor; sm_XXa only exact), else
 * a fatbin with such a cubin entry, else PTX to JIT (a .ptx file or a fatbin's PTX
 * entry, for the SM or lower). Strings are owned by the entry, valid until its next
 * select or its close. KCACHE_ERROR_NO_BINARY, with a message listing what the entry
 * has, when nothing fits. */
typedef struct kcache_selection {
    const char* file;   /* the entry's file */
    const char* format; /* "cubin", "fatbin", "ptx" */
    const char* arch;   /* of the code chosen: "sm_90" */
    int jit;            /* 1: PTX that the driver compiles when loading */
    int fatbin_entry;   /* fatbin: index of the entry chosen; -1 otherwise */
} kcache_selection;
KCACHE_API kcache_status kcache_entry_select_binary(kcache_entry* entry, int sm,
                                                    kcache_selection* out);

/* The entry's signature (docs/signature.md): the first of its JSON files that is a
 * kcache signature or Triton metadata. KCACHE_ERROR_NOT_FOUND when none is (the
 * message says what was skipped); KCACHE_ERROR_CORRUPT for one that breaks its
 * format. *out is a new handle for kcache_signature_free. */
KCACHE_API kcache_status kcache_entry_signature(kcache_entry* entry, kcache_signature** out);

/* ---- signatures ------------------------------------------------------------------ */

/* Parses a signature file's bytes (copied). KCACHE_ERROR_NOT_A_BINARY for input that
 * is not JSON or neither format, KCACHE_ERROR_CORRUPT for a broken one (the message
 * names the field), KCACHE_ERROR_UNSUPPORTED for a newer schema version. */
KCACHE_API kcache_status kcache_signature_parse(const void* json, size_t size,
                                                kcache_signature** out);
KCACHE_API void kcache_signature_free(kcache_signature* signature);        /* NULL is allowed */
KCACHE_API const char* kcache_signature_format(const kcache_signature* s); /* "kcache", "triton" */
KCACHE_API const char* kcache_signature_kernel(const kcache_signature* s);
/* The file of the entry holding the kernel; "" when the signature does not name one. */
KCACHE_API const char* kcache_signature_binary(const kcache_signature* s);
/* 1 when the signature lists parameters (Triton metadata may not). */
KCACHE_API int kcache_signature_has_params(const kcache_signature* s);
KCACHE_API size_t kcache_signature_param_count(const kcache_signature* s);

typedef struct kcache_sig_param {
    const char* name; /* "" when unnamed */
    const char* type; /* "i32", "f16", "ptr", "bytes", Triton's "*fp32" ... */
    uint32_t size;    /* bytes */
} kcache_sig_param;
KCACHE_API kcache_status kcache_signature_param(const kcache_signature* s, size_t param,
                                                kcache_sig_param* out);

/* A launch: grid and block dimensions, dynamic shared memory (bytes; above 48 KiB
 * the kernel is opted in first), and a CUstream (NULL: the default stream). */
typedef struct kcache_launch_config {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_memory;
    void* stream;
} kcache_launch_config;
/* Block and shared memory from the signature; grid 1x1x1; stream NULL. */
KCACHE_API void kcache_signature_launch_config(const kcache_signature* s,
                                               kcache_launch_config* out);
KCACHE_API void kcache_signature_cluster(const kcache_signature* s, uint32_t cluster[3]);

/* ---- the CUDA runtime ------------------------------------------------------------- */

typedef struct kcache_runtime kcache_runtime;
typedef struct kcache_kernel kcache_kernel;

/* Zero-initialize, then set what differs from the defaults. */
typedef struct kcache_runtime_options {
    const char* driver_library; /* NULL: $KCACHE_LIBCUDA, else "libcuda.so.1" */
    int device;                 /* CUDA device ordinal */
    size_t cache_capacity;      /* loaded kernels kept in the session cache; 0: 256 */
} kcache_runtime_options;

typedef struct kcache_session_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;
    size_t size;
    size_t capacity;
} kcache_session_stats;

/* Loads the CUDA driver (dlopen, never linked), gets the device and retains its
 * primary context. `options` may be NULL. Errors with a message naming the cause:
 * KCACHE_ERROR_NO_DRIVER (no libcuda.so.1, the toolkit's stub, a driver before CUDA
 * 11.3), KCACHE_ERROR_NO_DEVICE. A runtime and its kernels are thread-safe. */
KCACHE_API kcache_status kcache_runtime_open(const kcache_runtime_options* options,
                                             kcache_runtime** out);
/* NULL is allowed. Kernels still held stay usable until released. */
KCACHE_API void kcache_runtime_close(kcache_runtime* runtime);
KCACHE_API int kcache_runtime_sm(const kcache_runtime* runtime);             /* 90 for sm_90 */
KCACHE_API int kcache_runtime_driver_version(const kcache_runtime* runtime); /* 13000 */
KCACHE_API void kcache_runtime_stats(const kcache_runtime* runtime, kcache_session_stats* out);

/* The kernel `kernel` (NULL: the one the signature names, else the binary's only
 * kernel) of entry `key`: from the session cache, keyed by (cache and entry, kernel,
 * device) — a hit is one hash lookup — or loaded: binary selected for the device,
 * module loaded (PTX compiled by the driver, its log in the message), function looked
 * up, more than 48 KiB of dynamic shared memory opted in when the signature asks.
 * Errors: those of kcache_entry_open and kcache_entry_select_binary,
 * KCACHE_ERROR_NO_BINARY, KCACHE_ERROR_BAD_PTX, KCACHE_ERROR_OUT_OF_MEMORY (GPU),
 * KCACHE_ERROR_NOT_FOUND (no such kernel), KCACHE_ERROR_DRIVER.
 * *out is a new reference for kcache_kernel_release. */
KCACHE_API kcache_status kcache_runtime_get_kernel(kcache_runtime* runtime,
                                                   const kcache_cache* cache, const char* key,
                                                   const char* kernel, kcache_kernel** out);
/* As above from an open entry, bypassing the session cache. */
KCACHE_API kcache_status kcache_runtime_load_kernel(kcache_runtime* runtime, kcache_entry* entry,
                                                    const char* kernel, kcache_kernel** out);
KCACHE_API void kcache_kernel_release(kcache_kernel* kernel); /* NULL is allowed */
KCACHE_API const char* kcache_kernel_name(const kcache_kernel* kernel);
KCACHE_API const char* kcache_kernel_file(const kcache_kernel* kernel); /* the entry's file */
KCACHE_API size_t kcache_kernel_param_count(const kcache_kernel* kernel);
KCACHE_API kcache_status kcache_kernel_param(const kcache_kernel* kernel, size_t param,
                                             kcache_param* out);
/* Block and shared memory from the kernel's signature (1x1x1 and 0 without one). */
KCACHE_API void kcache_kernel_default_config(const kcache_kernel* kernel,
                                             kcache_launch_config* out);
/* Launches with `count` arguments: args[i] points at sizes[i] bytes, as
 * cuLaunchKernel's kernelParams. The list is checked against the kernel's parameters
 * first: KCACHE_ERROR_ARGUMENT_MISMATCH, and nothing launched, when it does not fit.
 * Launches are asynchronous: errors of the kernel itself surface at the next
 * synchronizing driver call. */
KCACHE_API kcache_status kcache_kernel_launch(const kcache_kernel* kernel,
                                              const kcache_launch_config* config, void** args,
                                              const size_t* sizes, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* KCACHE_LOADER_H */
