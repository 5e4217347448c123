// Shared helpers of the benchmark programs: synthetic cache content that looks and
// compresses like what compilers write, a temp directory, timing, and storing an
// entry through the core API. Not part of any installed interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/store.hpp"

namespace kcache::bench {

// splitmix64: a tiny deterministic generator; the same seed gives the same content.
class Rng {
  public:
    explicit Rng(std::uint64_t seed) : m_state(seed) {}
    std::uint64_t next() {
        std::uint64_t z = (m_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, n); n > 0.
    std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(next() % n); }

  private:
    std::uint64_t m_state;
};

// Synthetic files, distinct for distinct seeds, exactly `size` bytes each.
// cubin: an ELF-like header, 16-byte instruction words drawn from a small opcode set
//        with repeated blocks (unrolled loops), a string table, zero padding.
// json:  Triton-style kernel metadata.
// ptx:   PTX-like text (directives, register declarations, instruction lines).
std::string make_cubin(std::uint64_t seed, std::size_t size = 8192);
std::string make_json(std::uint64_t seed, std::size_t size = 1024);
std::string make_ptx(std::uint64_t seed, std::size_t size = 16384);

// A 32-hex-digit name derived from `i`, like a compiler's kernel hash.
std::string entry_name(std::uint64_t i);

struct FileSpec {
    std::string_view name;
    std::string_view content;
};

// Creates entry directory `entry` below the root and publishes `files` into it,
// inside `txn` (the caller commits). Appends the files' inode numbers to `inos`
// when given.
core::Status put_entry(core::WriteTxn& txn, std::string_view entry, std::span<const FileSpec> files,
                       const core::Origin& origin, std::vector<core::Ino>* inos = nullptr);

// A plain file's bytes (exits when it cannot be read).
std::string read_whole(const std::filesystem::path& path);
// The entries of `dir`, sorted by name.
std::vector<std::filesystem::path> sorted_children(const std::filesystem::path& dir);
// Imports `item` (a directory tree or a file; symlinks skipped) below `parent` inside
// `txn`, calling `on_file(path, content)` for each file stored.
void import_tree(
    core::WriteTxn& txn, core::Ino parent, const std::filesystem::path& item,
    const core::Origin& origin,
    const std::function<void(const std::filesystem::path&, std::string_view)>& on_file = {});

// Value of a counter/gauge in a fresh read transaction (0 on error, reported).
std::uint64_t gauge(const core::Store& store, core::Counter c);

// Aborts the program with the error's message: setup failures in a benchmark.
[[noreturn]] void die(const core::Error& error, std::string_view what);
template <class T>
T must(core::Result<T> r, std::string_view what) {
    if (!r) die(r.error(), what);
    return std::move(*r);
}
inline void must(core::Status s, std::string_view what) {
    if (!s) die(s.error(), what);
}

// A private temporary directory removed with its content. The base is $TMPDIR or
// /tmp (the same disk for the db and for plain-file baselines).
class TempDir {
  public:
    explicit TempDir(std::string_view prefix = "kcache-bench");
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return m_path; }
    std::filesystem::path operator/(std::string_view name) const { return m_path / name; }
    void keep() { m_path.clear(); }  // the destructor then leaves the directory alone

  private:
    std::filesystem::path m_path;
};

using SteadyClock = std::chrono::steady_clock;
inline double seconds_since(SteadyClock::time_point t0) {
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Median of `v` (sorted in place); 0 for an empty vector.
double median(std::vector<double>& v);
// p-quantile (0..1) of an already sorted vector.
double quantile_sorted(const std::vector<double>& v, double p);

std::string human_bytes(std::uint64_t bytes);  // "12.3 MiB (12,897,280 B)"

core::Durability parse_durability(std::string_view text);  // exits on a bad value
std::string_view durability_name(core::Durability d);

}  // namespace kcache::bench
