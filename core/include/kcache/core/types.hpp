// Plain data types shared by the store's API, the daemon, the CLI and the GUI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/statistics.hpp"  // Counter and the table of statistics

namespace kcache::core {

using Ino = std::uint64_t;                           // inode number; never reused within a db
inline constexpr Ino kRootIno = 1;                   // the cache's top directory
inline constexpr std::size_t kMaxNameLength = 255;   // bytes in one path component
inline constexpr std::size_t kMaxPathLength = 4095;  // bytes in a path below the root
// Largest file content: LMDB's largest value (and the bundle's 32-bit lengths).
inline constexpr std::uint64_t kMaxFileSize = 0xffffffffull;

// 128-bit content digest of a file's raw bytes. All zero for empty content.
struct Digest {
    std::uint64_t high = 0;
    std::uint64_t low = 0;
    bool empty() const { return high == 0 && low == 0; }
    std::string hex() const;  // 32 lower-case hex digits
    friend bool operator==(const Digest&, const Digest&) = default;
};

// Content of kSegmentedSize bytes or more is stored, and digested, as a list of
// kSegmentSize segments (the last one shorter), so that a change of a few pages
// re-hashes, recompresses and rewrites a few segments, not the whole file.
inline constexpr std::uint64_t kSegmentSize = 64 * 1024;
inline constexpr std::uint64_t kSegmentedSize = 1024 * 1024;
inline std::uint64_t segment_count(std::uint64_t size) {
    return (size + kSegmentSize - 1) / kSegmentSize;
}

// The digest kcache keys content by: XXH3-128 of the bytes below kSegmentedSize (the
// flat digest); at or above it, a seeded XXH3-128 of the concatenated digests of its
// segments (digest_of_segments), a different domain from any flat digest.
Digest digest_of(std::string_view bytes);
Digest flat_digest_of(
    std::string_view bytes);  // XXH3-128 of all bytes: schema <= 2 keyed every file so
Digest digest_of_segments(const std::vector<Digest>& segments);

// `special`: a fifo, socket, character or block device (schema 4). A cache never uses
// them, but a file system holds them (mknod(2)): a plain node, its mode says which,
// with no content, never an entry's file, never counted.
enum class FileType : std::uint8_t { regular = 1, directory = 2, symlink = 3, special = 4 };
// The type of a node with `mode` (its S_IFMT bits); anything but a directory, a
// symlink or a special node is a regular file.
FileType file_type_of(std::uint32_t mode);
// A node's type tests, on its mode as file_type_of reads it (the one way core reads the
// S_IFMT bits of a node; Attr's is_dir() and the others are these).
inline bool is_dir(std::uint32_t mode) {
    return file_type_of(mode) == FileType::directory;
}
inline bool is_regular(std::uint32_t mode) {
    return file_type_of(mode) == FileType::regular;
}
inline bool is_symlink(std::uint32_t mode) {
    return file_type_of(mode) == FileType::symlink;
}
inline bool is_special(std::uint32_t mode) {
    return file_type_of(mode) == FileType::special;
}

// Attributes of one node, as stat(2) would report them.
struct Attr {
    Ino ino = 0;
    std::uint32_t mode = 0;  // full st_mode: S_IFREG/S_IFDIR/S_IFLNK | permission bits
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::uint32_t nlink = 1;  // names: a file, symlink or special node may have several
    std::uint64_t size = 0;   // logical bytes (symlink: target length)
    std::int64_t atime_ns = 0;
    std::int64_t mtime_ns = 0;
    std::int64_t ctime_ns = 0;
    std::uint64_t rdev = 0;    // character and block devices: the device (st_rdev)
    Ino parent = 0;            // directory holding it (root: itself); with several
                               // names (nlink > 1), the directory of its first
    Ino entry = 0;             // the entry it belongs to; 0 outside every entry
    std::uint16_t depth = 0;   // root is 0, its children 1, ...
    Digest digest;             // regular files: digest of the content
    bool bookkeeping = false;  // a lock, stats, config or temp node: never counted (layout.hpp)

    FileType type() const;
    bool is_dir() const { return core::is_dir(mode); }
    bool is_regular() const { return core::is_regular(mode); }
    bool is_symlink() const { return core::is_symlink(mode); }
    bool is_special() const { return core::is_special(mode); }
};

struct DirEntry {
    std::string_view name;  // valid for the duration of the callback only
    Ino ino = 0;
    FileType type = FileType::regular;
};

// What a file is to a loader or a person, derived from its name (see roles.hpp).
enum class Role : std::uint8_t { other = 0, binary = 1, signature = 2, ir = 3 };

// A file (or directory, or symlink) of an entry, or below a directory: what
// Txn::for_each_entry_file and the functions of entry_files.hpp visit. The loader's
// plain-directory entries fill it from stat(2) (path, role, attr's mode and size).
struct EntryFile {
    std::string path;  // relative: below the entry's directory (node entries), or
                       // the file's name in its directory (stem entries)
    Attr attr;
    std::string link_target;  // symlinks
    Role role = Role::other;  // role_of(the path's last component); directories: other
};

// Which compiler most likely wrote an entry, guessed from the names of its files.
enum class Producer : std::uint8_t {
    unknown = 0,
    triton = 1,
    wave = 2,
    inductor = 3,
    jax = 4,
    ccache = 5,
    cutedsl = 6,
    helion = 7,
    kcache = 8,
};

// How an entry holds its files (layout.hpp says which one a compiler's tree gets).
enum class EntryKind : std::uint8_t {
    node = 0,  // a directory and everything below it (also a file of a schema-1 db)
    stem = 1,  // the files of one directory that share a stem: JAX's <key>-cache and
               // <key>-atime, Inductor's <key>.py/.cpp/.so, or a single file
};

// One cache entry (see layout.hpp): what a compiler reads and writes as one kernel.
struct EntryInfo {
    Ino ino = 0;       // its id: the directory's inode (node), else its own
    std::string name;  // path from the root, e.g. "triton/4FD1...A9", "jax/jit_f-1a2b"
    EntryKind kind = EntryKind::node;
    Ino parent = 0;                  // the directory holding it (0: unknown, schema-1 record)
    std::string stem;                // stem entries: the stem its files share
    bool by_rule = false;            // a compiler's layout formed it, not the depth fallback
    std::uint64_t bytes = 0;         // logical bytes of its regular files
    std::uint64_t stored_bytes = 0;  // bytes its blobs occupy in data.mdb (counting shared ones)
    std::uint64_t files = 0;         // regular files
    std::int64_t created_ns = 0;
    std::int64_t last_access_ns = 0;  // last publish or hit; the LRU order
    std::int64_t last_hit_ns = 0;
    std::uint64_t hits = 0;
    bool pinned = false;
    bool populated = false;  // has had a published file since it was last empty
    std::uint32_t populated_by_pid = 0;
    std::string populated_by_name;  // process name (comm) of the populating process
    Producer producer = Producer::unknown;
};

// An entry the shared tier supplied (Origin::fleet): populated by pid 0 named
// "fleet:<writer host>". Its hits are hits of the fleet (Counter::hits_fleet).
inline constexpr std::string_view kFleetOrigin = "fleet:";
inline bool is_fleet_entry(const EntryInfo& e) {
    return e.populated_by_pid == 0 && e.populated_by_name.starts_with(kFleetOrigin);
}

enum class EventKind : std::uint8_t {
    populate = 1,  // an entry's first file was published (a miss)
    hit = 2,
    evict = 3,
    pin = 4,
    unpin = 5,
    remove = 6,  // an entry's node was unlinked or replaced by a client
    rename = 7,  // an entry's node was renamed (name: the old name)
    import = 8,
    reset = 9,    // statistics were reset
    member = 10,  // a file of a stem entry appeared or went (parent + name: that file)
    update = 11,  // an entry's record changed and nothing else was logged for it (a file
                  // published into it after its populate, rewritten, removed, renamed in it)
};
// Decoders accept every kind; followers ignore kinds they do not know (a newer
// binary's), so a new kind never breaks an older reader.
std::string_view event_kind_name(EventKind k);

// One record of the events log. The daemon's invalidator follows it to tell the
// kernel what changed behind the mount (parent + name identify the dentry).
struct Event {
    std::uint64_t seq = 0;
    std::int64_t time_ns = 0;
    EventKind kind = EventKind::hit;
    Ino entry = 0;
    Ino parent = 0;
    std::string name;  // the entry's node name in `parent`
};

}  // namespace kcache::core
