// Errors at kcache's I/O boundaries.
//
// Every fallible operation returns Result<T> (tl::expected). An Error carries a
// POSIX errno value, so the FUSE daemon can hand it to the kernel unchanged, and a
// message that names what failed and why ("db /x/db: data.mdb: corrupt ...").
#pragma once

#include <string>
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

}  // namespace kcache::core
