// The validators of names and paths: one per kind, used wherever a name or a path
// comes from outside (a request, a bundle, a manifest, a loader's key).
//
// Each returns an empty Status when the name or path is acceptable, else an Error
// whose message names it and says why; callers add their own context
// (with_context). Pure functions: thread-safe, no allocation on success.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

// One path component: 1 to kMaxNameLength bytes, not "." or "..", no '/' or NUL.
// ENAMETOOLONG when it is too long, EINVAL otherwise.
Status check_name(std::string_view name);

// A relative path below the cache's root: not empty, not absolute, at most
// `max_length` bytes, components separated by single '/' (no empty component, so no
// trailing '/'), each one a valid name (check_name). EINVAL, whatever the cause.
Status check_path(std::string_view path, std::size_t max_length = kMaxPathLength);

// A symlink target for a link at `link_path` (a path from the root): not empty, not
// absolute, and resolved lexically from the link's directory it never climbs above
// the root, so a mount serving the link never leads a reader or writer out of the
// cache. EINVAL.
Status check_link_target(std::string_view link_path, std::string_view target);

// The directories above `path` (a path from the root), from the top down: "a/b/c" gives
// "a" and "a/b"; a single name gives none. Allocates.
std::vector<std::string> ancestor_dirs(std::string_view path);

}  // namespace kcache::core
