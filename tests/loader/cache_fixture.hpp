// Cache entries for the loader's tests: the same files as a plain directory and in a
// kcache db (written through core), and synthetic binaries and signatures.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "builders.hpp"
#include "kcache/core/store.hpp"
#include "temp_dir.hpp"

namespace kcache::test {

// The value of a Result the test needs (REQUIRE: it holds one; the message if not).
template <class T>
T value(kcache::core::Result<T> r) {
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    return std::move(*r);
}

// The error of a Result that must have failed (REQUIRE).
template <class T>
kcache::core::Error error(const kcache::core::Result<T>& r) {
    REQUIRE_FALSE(r.has_value());
    return r.error();
}

// name (relative to the entry, '/'-separated) -> bytes
using Files = std::map<std::string, std::string>;

inline void write_dir_entry(const std::filesystem::path& root, const std::string& key,
                            const Files& files) {
    for (const auto& [name, bytes] : files) {
        const auto path = root / key / name;
        std::filesystem::create_directories(path.parent_path());
        write_file(path, bytes);
    }
}

// Writes the entry into the db at `db` (created if missing), directories included.
inline void write_db_entry(const std::filesystem::path& db, const std::string& key,
                           const Files& files) {
    core::OpenOptions options;
    options.path = db.string();
    auto store = core::Store::open(options);
    INFO((store ? std::string() : store.error().message));
    REQUIRE(store);
    auto status = (*store)->update([&](core::WriteTxn& w) -> core::Status {
        for (const auto& [name, bytes] : files) {
            core::Ino dir = core::kRootIno;
            std::string path = key + "/" + name;
            std::size_t at = 0;
            for (std::size_t slash; (slash = path.find('/', at)) != std::string::npos;
                 at = slash + 1) {
                const std::string part = path.substr(at, slash - at);
                auto found = w.lookup(dir, part);
                if (found) {
                    dir = found->ino;
                    continue;
                }
                auto made = w.mkdir(dir, part, 0755);
                if (!made) return tl::unexpected(made.error());
                dir = made->ino;
            }
            auto file = w.create(dir, path.substr(at), 0644);
            if (!file) return tl::unexpected(file.error());
            auto written = w.write(file->ino, bytes, core::Origin::current());
            if (!written) return tl::unexpected(written.error());
        }
        return {};
    });
    INFO((status ? std::string() : status.error().message));
    REQUIRE(status);
}

// A cubin for `sm` (as CUDA 13 writes e_flags) with axpy(float, float*, float*, int).
inline std::string axpy_cubin(std::uint32_t sm) {
    const std::uint32_t flags = 0x06000000u | (sm << 8) | (sm >= 100 ? 0x02u : 0x04u);
    const std::string info =
        kparam_info(3, 24, 4) + kparam_info(2, 16, 8) + kparam_info(1, 8, 8) + kparam_info(0, 0, 4);
    return build_cubin({{"axpy", info}}, flags);
}

inline std::string axpy_ptx(std::uint32_t sm) {
    return ".version 8.0\n.target sm_" + std::to_string(sm) +
           "\n.address_size 64\n.visible .entry axpy(\n\t.param .f32 axpy_param_0,\n"
           "\t.param .u64 axpy_param_1,\n\t.param .u64 axpy_param_2,\n"
           "\t.param .u32 axpy_param_3\n)\n{\n\tret;\n}\n";
}

// A fatbin of axpy cubins for `cubin_sms` and PTX for `ptx_sm` (0: none).
inline std::string axpy_fatbin(const std::vector<std::uint32_t>& cubin_sms, std::uint32_t ptx_sm) {
    std::vector<EntrySpec> entries;
    for (auto sm : cubin_sms) entries.push_back(EntrySpec{2, sm, 0x11, axpy_cubin(sm)});
    if (ptx_sm) {
        EntrySpec ptx{1, ptx_sm, 0x11, axpy_ptx(ptx_sm)};
        ptx.major = 8;
        entries.push_back(ptx);
    }
    return build_container(entries);
}

inline std::string axpy_signature(std::uint32_t shared = 0, const std::string& binary = "") {
    return R"({"kcache_signature": 1, "kernel": "axpy",)" +
           (binary.empty() ? std::string() : "\"binary\": \"" + binary + "\", ") +
           R"("params": [{"name": "a", "type": "f32"}, {"name": "x", "type": "ptr"},
                         {"name": "y", "type": "ptr"}, {"name": "n", "type": "i32"}],
               "block": [128], "dynamic_shared_memory": )" +
           std::to_string(shared) + "}";
}

}  // namespace kcache::test
