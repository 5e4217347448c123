// What the C ABI's translation units share: the per-thread last error, the mapping
// of errno values (introspect.hpp, driver.hpp, cache.hpp) to kcache_status, and the
// guard that keeps exceptions from crossing the C boundary.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "kcache/core/error.hpp"
#include "kcache/loader.h"

namespace kcache::loader::capi {

// Sets the calling thread's last error; returns `status`.
kcache_status failed(kcache_status status, std::string message);
kcache_status failed(const core::Error& error);  // from_errno(error.code), its message
const char* last_error();
kcache_status from_errno(int code);

// Runs `fn` (returning kcache_status), turning exceptions into statuses.
template <class Fn>
kcache_status guarded(Fn&& fn) {
    try {
        return fn();
    } catch (const std::bad_alloc&) {
        return failed(KCACHE_ERROR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) {
        return failed(KCACHE_ERROR_INTERNAL, e.what());
    } catch (...) {
        return failed(KCACHE_ERROR_INTERNAL, "unknown exception");
    }
}

}  // namespace kcache::loader::capi
