// Errors at kcache's I/O boundaries.
//
// Every fallible operation returns Result<T> (tl::expected). An Error carries a
// POSIX errno value, so the FUSE daemon can hand it to the kernel unchanged, and a
// message that names what failed and why ("db /x/db: data.mdb: corrupt ...").
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include <tl/expected.hpp>

namespace kcache::core {

struct Error {
    int code = 0;         // errno value: ENOENT, EEXIST, ENOSPC, EIO (corruption), ...
    std::string message;  // human-readable, names the object and the cause
};

template <class T>
using Result = tl::expected<T, Error>;
using Status = Result<void>;

// Builds an unexpected Error; `return fail(ENOENT, "no such entry: {}", name)` style
// formatting is done by the caller (fmt) so this header stays dependency-free.
inline tl::unexpected<Error> fail(int code, std::string message) {
    return tl::unexpected<Error>(Error{code, std::move(message)});
}

// Prefixes the message of a failed result with context ("export a.kcb: ...").
Error with_context(Error error, const std::string& context);

namespace detail {
// KCACHE_TRY's value: T moved (or, from an lvalue Result, copied) out; nothing for Status.
template <class R>
auto try_value(R&& result) {
    if constexpr (!std::is_void_v<typename std::remove_cvref_t<R>::value_type>) {
        return *std::forward<R>(result);
    }
}
}  // namespace detail

}  // namespace kcache::core

// KCACHE_TRY(expr): propagate a failure unchanged.
//
// `expr` is a Result<T> or a Status, evaluated once. If it failed, the enclosing
// function (or lambda) returns tl::unexpected(its Error), unchanged, with no added
// context; so that function must return a Result or Status itself. Otherwise the
// macro's value is the T (moved out of a temporary, copied out of an lvalue), or
// void for a Status:
//
//     auto ref = KCACHE_TRY(tx.blob_ref(digest));  // Result<T>: binds the T
//     KCACHE_TRY(tx.put(dbi, key, value));          // Status: a statement
//
// A GNU statement expression (GCC, clang), marked __extension__ so -Wpedantic
// accepts it. Where a failure needs context, write it out with with_context().
#define KCACHE_TRY(...) KCACHE_TRY_IMPL_(KCACHE_TRY_CAT_(kcache_try_, __COUNTER__), __VA_ARGS__)
#define KCACHE_TRY_CAT_(a, b) KCACHE_TRY_CAT2_(a, b)
#define KCACHE_TRY_CAT2_(a, b) a##b
#define KCACHE_TRY_IMPL_(tmp, ...)                                           \
    __extension__({                                                          \
        auto&& tmp = (__VA_ARGS__);                                          \
        if (!tmp)                                                            \
            return ::tl::unexpected<::kcache::core::Error>(                  \
                std::forward<decltype(tmp)>(tmp).error());                   \
        ::kcache::core::detail::try_value(std::forward<decltype(tmp)>(tmp)); \
    })
