// What kcache-fsd tells the kernel about a node: struct stat, entries, timeouts; and
// who asked (the origin recorded with a publish). Shared by the handlers' files.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <ctime>

#include "kcache/core/store.hpp"
#include "process.hpp"

namespace kcache::fsd::kernel {

// Entries (names) and directory attributes: cached long, invalidated explicitly.
inline constexpr double kEntryTimeout = 86400;
inline constexpr double kDirAttrTimeout = 86400;
inline constexpr double kNegativeTimeout = 86400;
// Regular files: cached long while every caller gets the same answer
// (Filesystem::attr_timeout), invalidated by notification when that answer changes.
inline constexpr double kFileAttrTimeout = 86400;

inline struct stat to_stat(const core::Attr& a) {
    struct stat st {};
    st.st_ino = a.ino;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink;
    st.st_rdev = static_cast<dev_t>(a.rdev);
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = static_cast<off_t>(a.size);
    st.st_blksize = 4096;
    st.st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
    auto ts = [](std::int64_t ns) {
        return timespec{static_cast<time_t>(ns / 1'000'000'000),
                        static_cast<long>(ns % 1'000'000'000)};
    };
    st.st_atim = ts(a.atime_ns);
    st.st_mtim = ts(a.mtime_ns);
    st.st_ctim = ts(a.ctime_ns);
    return st;
}

// What the kernel caches about a name it looked up (or created).
inline fuse_entry_param entry_param(const core::Attr& a, double attr_timeout) {
    fuse_entry_param e{};
    e.ino = a.ino;
    e.generation = 1;
    e.attr = to_stat(a);
    e.attr_timeout = attr_timeout;
    e.entry_timeout = kEntryTimeout;
    return e;
}

inline std::int64_t ns_of(const timespec& ts) {
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline core::Origin origin_of(fuse_req_t req) {
    const Caller caller = caller_of(fuse_req_ctx(req)->pid);
    return core::Origin{caller.pid, caller.name};
}

}  // namespace kcache::fsd::kernel
