// One entry in detail: its record and files, and one file's content prepared for
// viewing (text with lines, a pretty-printed signature, or a binary as hex and as
// the loader's introspection).
//
// Both are loaded in one read transaction each and own everything they hold (no
// views into the map), so they stay valid after the db changes. Thread: the caller's.
// Failures: load() returns core's errors (ENOENT once the entry or file is gone).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kcache/core/store.hpp"
#include "kcache/core/types.hpp"
#include "kcache/gui/text.hpp"
#include "kcache/loader/introspect.hpp"

namespace kcache::gui {

// A file of an entry: core's (path relative to the entry, attributes, role, link target).
using EntryFile = core::EntryFile;

class EntryDetail {
  public:
    static core::Result<EntryDetail> load(const core::Store& store, core::Ino entry);
    const core::EntryInfo& info() const { return m_info; }
    const std::vector<EntryFile>& files() const { return m_files; }  // path order
    std::uint64_t txn_id() const { return m_txn_id; }

  private:
    core::EntryInfo m_info;
    std::vector<EntryFile> m_files;
    std::uint64_t m_txn_id = 0;
};

// A file's content for the viewer.
struct FileView {
    enum class Kind { text, signature, binary };
    core::Ino ino = 0;
    std::string path;
    Kind kind = Kind::text;
    std::uint64_t size = 0;  // the file's size
    bool truncated = false;  // only the first max_bytes were loaded
    std::string bytes;       // the content loaded (binary views read this)
    TextDocument text;       // text; signature: pretty-printed when it is JSON
    // Binaries: what the loader found, or why it could not tell.
    std::optional<loader::BinaryInfo> binary;
    std::string binary_error;
};

inline constexpr std::size_t kMaxViewBytes = 16u << 20;

// Loads a regular file's content (at most `max_bytes`) and prepares it by role:
// IR and other text as text, signatures pretty-printed (JSON), binaries introspected.
core::Result<FileView> load_file_view(const core::Store& store, const EntryFile& file,
                                      std::size_t max_bytes = kMaxViewBytes);

// True when `bytes` looks like text (no NUL, few control characters).
bool looks_like_text(std::string_view bytes);

}  // namespace kcache::gui
