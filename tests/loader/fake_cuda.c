/* A fake CUDA driver for the loader's tests: built as libcuda.so.1 in its own
 * directory, it exports the entry points libkcache_loader resolves (through
 * cuGetProcAddress, as the real driver does), records every call, and fails on
 * request. No GPU is involved: modules are copies of the image, launches are logged.
 *
 * Controlled by the environment, read at each call:
 *   FAKE_CUDA_SM=86          compute capability (default 90)
 *   FAKE_CUDA_DEVICES=0      device count (default 1)
 *   FAKE_CUDA_STUB=1         behave as the toolkit's stub (every call: error 34)
 *   FAKE_CUDA_FAIL=cuModuleLoadDataEx:218,cuInit:100   calls that fail, with a result
 *   FAKE_CUDA_JIT_LOG=text   written to the JIT error log when cuModuleLoadDataEx fails
 * and read through fake_cuda_log() / fake_cuda_reset() (dlsym them from this library):
 * one line per call, "cuLaunchKernel grid=2,1,1 block=128,1,1 shared=0". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
enum { kOk = 0, kInvalidValue = 1, kStub = 34, kNoDevice = 100, kNotFound = 500 };

struct Module {
    char* image;
    size_t size;
};
struct Function {
    struct Module* module;
    char name[256];
};

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static char g_log[1 << 16];
static size_t g_log_used;
static int g_context_object;
static __thread void* t_current;

static void record(const char* format, ...) __attribute__((format(printf, 1, 2)));
static void record(const char* format, ...) {
    va_list args;
    pthread_mutex_lock(&g_mutex);
    if (g_log_used < sizeof g_log) {
        va_start(args, format);
        int n = vsnprintf(g_log + g_log_used, sizeof g_log - g_log_used, format, args);
        va_end(args);
        if (n > 0) g_log_used += (size_t)n;
        if (g_log_used < sizeof g_log - 1) g_log[g_log_used++] = '\n';
        if (g_log_used >= sizeof g_log) g_log_used = sizeof g_log - 1;
        g_log[g_log_used] = '\0';
    }
    pthread_mutex_unlock(&g_mutex);
}

EXPORT const char* fake_cuda_log(void) {
    return g_log;
}

EXPORT void fake_cuda_reset(void) {
    pthread_mutex_lock(&g_mutex);
    g_log_used = 0;
    g_log[0] = '\0';
    pthread_mutex_unlock(&g_mutex);
}

static int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

/* The result FAKE_CUDA_FAIL asks `call` to fail with, or 0. */
static CUresult injected(const char* call) {
    if (env_int("FAKE_CUDA_STUB", 0)) return kStub;
    const char* spec = getenv("FAKE_CUDA_FAIL");
    size_t n = strlen(call);
    while (spec && *spec) {
        if (strncmp(spec, call, n) == 0 && spec[n] == ':') return atoi(spec + n + 1);
        spec = strchr(spec, ',');
        if (spec) ++spec;
    }
    return kOk;
}

#define FAIL_IF_ASKED(call)                    \
    do {                                       \
        CUresult rc_ = injected(call);         \
        if (rc_ != kOk) {                      \
            record("%s failed %d", call, rc_); \
            return rc_;                        \
        }                                      \
    } while (0)

static CUresult fake_init(unsigned flags) {
    record("cuInit %u", flags);
    FAIL_IF_ASKED("cuInit");
    return env_int("FAKE_CUDA_DEVICES", 1) > 0 ? kOk : kNoDevice;
}

static CUresult fake_driver_get_version(int* version) {
    FAIL_IF_ASKED("cuDriverGetVersion");
    *version = 12040;
    return kOk;
}

static CUresult fake_device_get_count(int* count) {
    FAIL_IF_ASKED("cuDeviceGetCount");
    *count = env_int("FAKE_CUDA_DEVICES", 1);
    return kOk;
}

static const char* error_name(CUresult rc) {
    switch (rc) {
        case 0:
            return "CUDA_SUCCESS";
        case 1:
            return "CUDA_ERROR_INVALID_VALUE";
        case 2:
            return "CUDA_ERROR_OUT_OF_MEMORY";
        case 3:
            return "CUDA_ERROR_NOT_INITIALIZED";
        case 34:
            return "CUDA_ERROR_STUB_LIBRARY";
        case 100:
            return "CUDA_ERROR_NO_DEVICE";
        case 200:
            return "CUDA_ERROR_INVALID_IMAGE";
        case 209:
            return "CUDA_ERROR_NO_BINARY_FOR_GPU";
        case 218:
            return "CUDA_ERROR_INVALID_PTX";
        case 222:
            return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
        case 500:
            return "CUDA_ERROR_NOT_FOUND";
        case 701:
            return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
        default:
            return NULL;
    }
}

static CUresult fake_get_error_name(CUresult rc, const char** name) {
    *name = error_name(rc);
    return *name ? kOk : kInvalidValue;
}

static CUresult fake_get_error_string(CUresult rc, const char** text) {
    switch (rc) {
        case 2:
            *text = "out of memory";
            break;
        case 100:
            *text = "no CUDA-capable device is detected";
            break;
        case 209:
            *text = "no kernel image is available for execution on the device";
            break;
        case 218:
            *text = "a PTX JIT compilation failed";
            break;
        case 222:
            *text = "the provided PTX was compiled with an unsupported toolchain.";
            break;
        case 500:
            *text = "named symbol not found";
            break;
        default:
            *text = error_name(rc) ? "fake error" : NULL;
            break;
    }
    return *text ? kOk : kInvalidValue;
}

static CUresult fake_device_get(int* device, int ordinal) {
    FAIL_IF_ASKED("cuDeviceGet");
    if (ordinal < 0 || ordinal >= env_int("FAKE_CUDA_DEVICES", 1)) return kInvalidValue;
    *device = ordinal;
    return kOk;
}

static CUresult fake_device_get_attribute(int* value, int attribute, int device) {
    (void)device;
    FAIL_IF_ASKED("cuDeviceGetAttribute");
    const int sm = env_int("FAKE_CUDA_SM", 90);
    switch (attribute) {
        case 75:
            *value = sm / 10;
            return kOk;
        case 76:
            *value = sm % 10;
            return kOk;
        case 97:
            *value = 232448;
            return kOk; /* an H100's opt-in maximum */
        default:
            return kInvalidValue;
    }
}

static CUresult fake_primary_ctx_retain(void** context, int device) {
    record("cuDevicePrimaryCtxRetain %d", device);
    FAIL_IF_ASKED("cuDevicePrimaryCtxRetain");
    *context = &g_context_object;
    return kOk;
}

static CUresult fake_primary_ctx_release(int device) {
    record("cuDevicePrimaryCtxRelease %d", device);
    return kOk;
}

static CUresult fake_ctx_get_current(void** context) {
    *context = t_current;
    return kOk;
}

static CUresult fake_ctx_set_current(void* context) {
    record("cuCtxSetCurrent");
    t_current = context;
    return kOk;
}

/* The size of a cubin (ELF64: the end of its headers and tables), a fatbin (its
 * header) or PTX (text up to its NUL). */
static size_t image_size(const unsigned char* image, const char** kind) {
    uint64_t v64;
    uint32_t v32;
    memcpy(&v32, image, 4);
    if (memcmp(image, "\177ELF", 4) == 0) {
        uint64_t shoff, phoff;
        uint16_t shentsize, shnum, phentsize, phnum;
        memcpy(&phoff, image + 32, 8);
        memcpy(&shoff, image + 40, 8);
        memcpy(&phentsize, image + 54, 2);
        memcpy(&phnum, image + 56, 2);
        memcpy(&shentsize, image + 58, 2);
        memcpy(&shnum, image + 60, 2);
        size_t a = (size_t)(shoff + (uint64_t)shentsize * shnum);
        size_t b = (size_t)(phoff + (uint64_t)phentsize * phnum);
        *kind = "cubin";
        return a > b ? a : b;
    }
    if (v32 == 0xBA55ED50u) {
        memcpy(&v64, image + 8, 8);
        *kind = "fatbin";
        return (size_t)(16 + v64);
    }
    *kind = "ptx";
    return strlen((const char*)image) + 1;
}

static CUresult fake_module_load_data_ex(struct Module** module, const void* image, unsigned count,
                                         int* options, void** values) {
    const char* kind = "?";
    size_t size = image_size(image, &kind);
    char* error_log = NULL;
    size_t error_log_size = 0;
    for (unsigned i = 0; i < count; ++i) {
        if (options[i] == 5) error_log = values[i];
        if (options[i] == 6) error_log_size = (size_t)(uintptr_t)values[i];
    }
    CUresult rc = injected("cuModuleLoadDataEx");
    if (rc != kOk) {
        const char* log = getenv("FAKE_CUDA_JIT_LOG");
        if (log && error_log && error_log_size) snprintf(error_log, error_log_size, "%s\n", log);
        record("cuModuleLoadDataEx %s failed %d", kind, rc);
        return rc;
    }
    if (t_current != &g_context_object) {
        record("cuModuleLoadDataEx without a current context");
        return 201;
    }
    struct Module* m = calloc(1, sizeof *m);
    m->image = malloc(size);
    memcpy(m->image, image, size);
    m->size = size;
    *module = m;
    record("cuModuleLoadDataEx %s %zu", kind, size);
    return kOk;
}

static CUresult fake_module_unload(struct Module* module) {
    record("cuModuleUnload");
    free(module->image);
    free(module);
    return kOk;
}

static CUresult fake_module_get_function(struct Function** function, struct Module* module,
                                         const char* name) {
    FAIL_IF_ASKED("cuModuleGetFunction");
    size_t n = strlen(name);
    if (n >= sizeof((struct Function*)0)->name || !memmem(module->image, module->size, name, n)) {
        record("cuModuleGetFunction %s not found", name);
        return kNotFound;
    }
    struct Function* f = calloc(1, sizeof *f); /* leaked: functions live with the process */
    f->module = module;
    memcpy(f->name, name, n + 1);
    *function = f;
    record("cuModuleGetFunction %s", name);
    return kOk;
}

static CUresult fake_func_set_attribute(struct Function* function, int attribute, int value) {
    record("cuFuncSetAttribute %s %d %d", function->name, attribute, value);
    FAIL_IF_ASKED("cuFuncSetAttribute");
    return kOk;
}

static CUresult fake_launch_kernel(struct Function* f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                   void* stream, void** params, void** extra) {
    (void)stream;
    (void)extra;
    FAIL_IF_ASKED("cuLaunchKernel");
    if (t_current != &g_context_object) return 201;
    record("cuLaunchKernel %s grid=%u,%u,%u block=%u,%u,%u shared=%u params=%s", f->name, gx, gy,
           gz, bx, by, bz, shared, params ? "yes" : "none");
    return kOk;
}

struct Entry {
    const char* name;
    void* fn;
};

static const struct Entry kEntries[] = {
    {"cuInit", (void*)fake_init},
    {"cuDriverGetVersion", (void*)fake_driver_get_version},
    {"cuDeviceGetCount", (void*)fake_device_get_count},
    {"cuGetErrorName", (void*)fake_get_error_name},
    {"cuGetErrorString", (void*)fake_get_error_string},
    {"cuDeviceGet", (void*)fake_device_get},
    {"cuDeviceGetAttribute", (void*)fake_device_get_attribute},
    {"cuDevicePrimaryCtxRetain", (void*)fake_primary_ctx_retain},
    {"cuDevicePrimaryCtxRelease", (void*)fake_primary_ctx_release},
    {"cuCtxGetCurrent", (void*)fake_ctx_get_current},
    {"cuCtxSetCurrent", (void*)fake_ctx_set_current},
    {"cuModuleLoadDataEx", (void*)fake_module_load_data_ex},
    {"cuModuleUnload", (void*)fake_module_unload},
    {"cuModuleGetFunction", (void*)fake_module_get_function},
    {"cuFuncSetAttribute", (void*)fake_func_set_attribute},
    {"cuLaunchKernel", (void*)fake_launch_kernel},
};

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                    unsigned long long flags, int* status) {
    (void)version;
    (void)flags;
    if (status) *status = 0;
    if (env_int("FAKE_CUDA_STUB", 0)) return kStub;
    for (size_t i = 0; i < sizeof kEntries / sizeof kEntries[0]; ++i) {
        if (strcmp(kEntries[i].name, symbol) == 0) {
            *pfn = kEntries[i].fn;
            return kOk;
        }
    }
    *pfn = NULL;
    return kNotFound;
}

EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                 unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
