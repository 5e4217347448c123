// An entry image: one entry's files and metadata, out of the db. The one shape in which
// an entry travels between a db and anything else (the shared tier's manifests, and
// whatever else encodes an entry), with one reader from the db (read_image), one
// validator (check_image) and one writer into the db (write_image).
//
// Paths in an image are relative, as in EntryFile: below the entry's directory (node
// entries) or the file's name in the entry's directory (stem entries, and a node entry
// that is one file, `single`). A file's content
// is either carried (`has_content`) or referenced by its digest and size, resolved by
// the writer's caller (blobs fetched apart, or already in the db).
//
// Everything here works inside the caller's transaction and owns its strings.
// Failures: check_image EINVAL naming the fault; read_image and write_image core's
// read/write errors with the file's path as context.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/error.hpp"
#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"

namespace kcache::core {

// Longest path an image holds (an entry's name or a file's): the str16 of the formats
// that encode images. Longer than kMaxPathLength: the tree has no path limit.
inline constexpr std::size_t kMaxImagePath = 0xffff;

struct ImageFile {
    std::string path;  // relative (see above); directories before what they hold
    FileType type = FileType::regular;
    std::uint32_t mode = 0;  // permission bits, written as they are
    std::int64_t mtime_ns = 0;
    std::uint64_t size = 0;  // regular files
    Digest digest;           // regular files
    bool has_content = false;
    std::string content;  // regular files with has_content: the raw bytes
    std::string target;   // symlinks
};

struct EntryImage {
    std::string name;  // EntryInfo::name
    EntryKind kind = EntryKind::node;
    std::string stem;  // stem entries
    // A node entry that is one file or symlink, not a directory (a schema-1 db's): its
    // only file is the entry's node itself, named by the entry's last component.
    bool single = false;
    std::uint32_t dir_mode = 0755;             // node entries: the entry directory's bits
    std::optional<std::int64_t> dir_mtime_ns;  // node entries: set when known
    Producer producer = Producer::unknown;
    std::int64_t created_ns = 0;
    std::vector<ImageFile> files;
};

// The directory an entry's name lives in ("" at the root), and the path of `file` of
// `image` from the cache's root.
std::string image_dir(const EntryImage& image);
std::string image_path(const EntryImage& image, const ImageFile& file);

// Everything an image could get wrong, whoever decoded it: the entry's name and every
// path (check_path, at most kMaxImagePath), a stem entry's name being its directory and
// its stem and its files being files named with the stem, a single node entry being one
// file named by the entry, a node entry's files coming
// after their directory, no path twice, symlink targets inside the cache
// (check_link_target), carried contents of the size declared. EINVAL, the message
// naming the file.
Status check_image(const EntryImage& image);

// The image of `entry` from `txn`: its metadata and files (EntryFile order: directories
// before what they hold). With `contents`, every regular file's raw bytes are carried.
Result<EntryImage> read_image(const Txn& txn, const EntryInfo& entry, bool contents);

struct ImageWrite {
    // Who publishes the files (nullopt: this process). A pull passes Origin::fleet.
    std::optional<Origin> origin;
    // The content of a regular file the image does not carry; null or nullopt: EIO.
    std::function<std::optional<std::string_view>(const ImageFile&)> content;
    // Log an `import` event for the entry's top node(s), so that a daemon learns the
    // names from the log (bundle import does; a pull's writes are logged by the store).
    bool log_import = false;
    // Check that the entry written forms the same entry here (EINVAL if not). Bundle
    // import does not: a bundle may carry entries between dbs of other layouts, where
    // what its files form is what the layout there says.
    bool same_entry = true;
};

// Writes a checked image (check_image) into `txn`, making the directories above it
// (like mkdir -p) and filling an empty entry directory already there, then (same_entry)
// checks that the layout here forms the same entry (else EINVAL: the rules differ). The
// caller commits or drops the transaction; on any error it must drop it.
Status write_image(WriteTxn& txn, const EntryImage& image, const ImageWrite& how = {});

}  // namespace kcache::core
