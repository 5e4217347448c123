// Opening a kernel cache and reading its entries, without the compiler that wrote it.
//
// A Cache is either a kcache LMDB db (a directory holding data.mdb), read directly
// through core in a read-only snapshot, or any plain cache directory (the kcache
// mount, a native ~/.triton/cache, ~/.wave). An entry is named by its key: the
// entry's path below the cache's root (Triton's and Wave's kernel-hash directory,
// or a flat file). Its files are the regular files below it, named by their path
// relative to the entry ("kernel.cubin"); directories named tmp.* (writes in flight)
// are left out.
//
// Threads: a Cache is thread-safe and shared (shared_ptr). An Entry belongs to one
// thread at a time. A db Entry holds a read snapshot until it is destroyed: content
// read from it stays valid (and the db's pages stay allocated) that long, so entries
// are meant to be short-lived.
//
// Errors: ENOENT no such cache or entry; EINVAL a key that is empty, absolute or has
// "." / ".." / empty components; EIO a damaged db; other errno values from the
// filesystem (EACCES, ...). Messages name the path.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/types.hpp"
#include "kcache/loader/introspect.hpp"
#include "kcache/loader/signature.hpp"

namespace kcache::loader {

// A file of an entry: core's, with its path relative to the entry ('/'-separated),
// its role, and attr.size and attr.mode (from a db, every attribute).
using EntryFile = core::EntryFile;

class KCACHE_LOADER_API Entry {
  public:
    virtual ~Entry() = default;
    const std::string& key() const { return m_key; }
    const std::vector<EntryFile>& files() const { return m_files; }  // in name order
    // The content of file `name` (one of files()), valid as long as this Entry. From
    // a db, content stored uncompressed in one page is a view into the map; larger or
    // compressed content is assembled once. Read again, the same bytes are returned.
    virtual Result<std::string_view> read(std::string_view name) = 0;

  protected:
    Entry() = default;
    std::string m_key;
    std::vector<EntryFile> m_files;
};

class KCACHE_LOADER_API Cache : public std::enable_shared_from_this<Cache> {
  public:
    enum class Kind { db, directory };

    // `path` holding data.mdb is opened as a db (read-only, never created); any other
    // directory as a plain cache directory.
    static Result<std::shared_ptr<Cache>> open(const std::string& path);
    virtual ~Cache() = default;

    Kind kind() const { return m_kind; }
    const std::string& path() const { return m_path; }  // absolute
    // An entry keeps its Cache alive.
    virtual Result<std::unique_ptr<Entry>> entry(std::string_view key) const = 0;

  protected:
    Cache() = default;
    Kind m_kind = Kind::directory;
    std::string m_path;
};

KCACHE_LOADER_API std::string_view cache_kind_name(Cache::Kind kind);  // "db", "directory"

// ---- entry -> kernel ----------------------------------------------------------------

// An SM architecture as a number and a variant: sm_90 {90, ""}, sm_90a {90, "a"},
// sm_100f {100, "f"}. PTX's compute_90 reads as {90, ""}.
struct Arch {
    int sm = 0;
    std::string variant;
};
KCACHE_LOADER_API std::optional<Arch> parse_arch(std::string_view arch);
// Whether a cubin for `arch` runs on a device of SM `device_sm` (docs/loader.md):
// the same SM always; a plain or "f" cubin also on a later minor of the same major
// (sm_80 on sm_86; sm_100f on sm_103); an "a" cubin only on its own SM.
KCACHE_LOADER_API bool cubin_runs_on(const Arch& arch, int device_sm);
// Whether the driver can JIT PTX for `arch` on the device: a plain target up to the
// device's SM; "a" and "f" targets as for cubins.
KCACHE_LOADER_API bool ptx_runs_on(const Arch& arch, int device_sm);

// The binary chosen for a device. Order: a cubin file for the SM (exact before
// compatible); else a fatbin with a cubin entry for it; else PTX to JIT (a .ptx file
// or a fatbin's PTX entry, the highest target that fits).
struct Selection {
    std::string file;  // the entry's file
    Format format = Format::cubin;
    std::string arch;       // of the code the driver will run or compile: "sm_90"
    bool jit = false;       // PTX: compiled by the driver when loaded
    int fatbin_entry = -1;  // fatbin: index of the entry chosen above
    BinaryInfo info;        // introspection of the file
    // The kernels of the chosen code (info.kernels, or the fatbin entry's); null when
    // they could not be read (a compressed fatbin entry beyond the limit).
    KCACHE_LOADER_API const std::vector<KernelInfo>* kernels() const;
};

// ENXIO when the entry has no binary for `device_sm`: the message says what it has
// ("kernel.cubin is sm_100; kernel.ptx targets sm_120"). `only_file` (from a
// signature's "binary") restricts the choice to that file.
KCACHE_LOADER_API Result<Selection> select_binary(Entry& entry, int device_sm,
                                                  std::string_view only_file = {});

// The entry's signature: among its JSON files (core's signature role), the first in
// name order that parses as a kcache signature or Triton metadata (a file named like
// `preferred_stem` first: kernel.json for kernel.cubin). ENOENT when none does; the
// message lists what was skipped and why. A file that claims a format and breaks it
// is an error (EIO), not skipped.
KCACHE_LOADER_API Result<Signature> find_signature(Entry& entry,
                                                   std::string_view preferred_stem = {});

}  // namespace kcache::loader
