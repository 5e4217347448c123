#include "kcache/core/names.hpp"

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

namespace kcache::core {

Status check_name(std::string_view name) {
    if (name.size() > kMaxNameLength) {
        return fail(ENAMETOOLONG,
                    fmt::format("name of {} bytes is longer than {}", name.size(), kMaxNameLength));
    }
    if (name.empty() || name == "." || name == ".." ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
        return fail(EINVAL, fmt::format("invalid name '{}'", name));
    }
    return {};
}

Status check_path(std::string_view path, std::size_t max_length) {
    if (path.empty() || path.size() > max_length || path.front() == '/') {
        return fail(EINVAL, fmt::format("path '{}': empty, absolute or too long", path));
    }
    for (std::size_t at = 0; at <= path.size();) {
        const std::size_t slash = std::min(path.find('/', at), path.size());
        if (auto s = check_name(path.substr(at, slash - at)); !s) {
            return fail(EINVAL, fmt::format("path '{}': {}", path, s.error().message));
        }
        at = slash + 1;
    }
    return {};
}

Status check_link_target(std::string_view link_path, std::string_view target) {
    if (target.empty() || target.front() == '/') {
        return fail(EINVAL, fmt::format("symlink '{}': empty or absolute target", link_path));
    }
    // The depth of the directory holding the link, then of each component followed.
    auto depth = static_cast<std::size_t>(std::count(link_path.begin(), link_path.end(), '/'));
    for (std::size_t at = 0; at <= target.size();) {
        const std::size_t slash = std::min(target.find('/', at), target.size());
        const std::string_view part = target.substr(at, slash - at);
        if (part == "..") {
            if (depth == 0) {
                return fail(EINVAL, fmt::format("symlink '{}': target '{}' leaves the cache",
                                                link_path, target));
            }
            --depth;
        } else if (!part.empty() && part != ".") {
            ++depth;
        }
        at = slash + 1;
    }
    return {};
}

std::vector<std::string> ancestor_dirs(std::string_view path) {
    std::vector<std::string> dirs;
    for (auto slash = path.find('/'); slash != std::string_view::npos;
         slash = path.find('/', slash + 1)) {
        if (slash > 0) dirs.emplace_back(path.substr(0, slash));
    }
    return dirs;
}

}  // namespace kcache::core
