// Staged writes: a file's new content is built in memory and published atomically.
//
// A writer (the FUSE daemon for an open file, or any tool) stages content, writes at
// offsets, truncates, reads its own writes, and then publishes in one write
// transaction. Until then readers see the previous content. While staged, the file's
// entry holds a write lease and is never evicted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/core/store.hpp"

namespace kcache::core {
namespace ops {
struct ContentDigests;  // content.cpp
}

// Where a staged file's content is mirrored as it changes, so that it outlives the
// process holding it (kcache-fsd's spill files, fsd/src/survival/spill.hpp: a writer's bytes
// survive a crash of the daemon). A StagedFile calls it after each change it made, under
// whatever guards the StagedFile; reset() carries the whole content (the first change),
// write() and resize() the later ones. A call that fails drops the mirror: drop() says
// why, and what it held must not be taken for the content any more. The change itself
// stands (its content lives on in memory).
class StagedMirror {
  public:
    virtual ~StagedMirror() = default;
    virtual Status reset(std::string_view content) = 0;
    virtual Status write(std::uint64_t offset, std::string_view data) = 0;  // may pass the end
    virtual Status resize(std::uint64_t size) = 0;
    virtual void drop(const Error& why) = 0;
};

class StagedFile {
  public:
    // Takes a write lease on `file` (a regular file) and starts from its current
    // content, or from empty content when `truncate` (O_TRUNC).
    static Result<StagedFile> begin(Store& store, Ino file, bool truncate);
    // The same inside `txn` (e.g. with the create of the file): the lease exists
    // once the caller commits; if the caller aborts instead, call forget().
    static Result<StagedFile> begin(WriteTxn& txn, Ino file, bool truncate);

    StagedFile(StagedFile&& other) noexcept;
    StagedFile& operator=(StagedFile&& other) noexcept;
    StagedFile(const StagedFile&) = delete;
    StagedFile& operator=(const StagedFile&) = delete;
    ~StagedFile();  // abandons (releases the lease) if not published

    Ino ino() const { return m_ino; }
    // Writes at `offset`, filling a gap with zeros. EFBIG past `max_size` (if set) or
    // kMaxFileSize; ENOMEM when the content cannot be held in memory.
    Status write(std::uint64_t offset, std::string_view data);
    Status truncate(std::uint64_t size);  // EFBIG past the limits
    // The staged content's size, known from begin on.
    std::uint64_t size() const { return m_loaded ? m_content.size() : m_unloaded_size; }
    // The staged content. A file begun from its stored content reads that content at
    // its first use (here, a write or a truncate that keeps part of it), not at begin:
    // an open for writing that never changes the file (fsync, an ioctl) reads none of
    // it. The content read is the version begun from or, if another writer published
    // the file since, that newer one (its bytes came first, as on a disk). What may
    // fail: reading it (EIO on damaged or missing content, ENOMEM); `write` and
    // `truncate` then fail the same way and change nothing.
    Result<std::string_view> content();
    bool dirty() const { return m_dirty; }
    // The digest of the stored content this one last matched: the content it began
    // from (empty digest when it began truncated from an empty file), then the content
    // it last published. Readers of that stored version may follow this one.
    const Digest& stored_digest() const { return m_stored; }
    void set_max_size(std::uint64_t max_size) { m_max_size = max_size; }
    // Mirrors every later change to `mirror` (see StagedMirror), and the content at once
    // when it differs from the stored one already (an O_TRUNC). `holds_content`: the
    // mirror holds this content already (it was loaded from it).
    void mirror_to(std::shared_ptr<StagedMirror> mirror, bool holds_content = false);
    bool mirrored() const { return m_mirror != nullptr; }  // has a mirror (not dropped)

    // Publishes the content and releases the lease in one transaction of its own, or
    // inside `txn` (committed by the caller, e.g. a batch of many files).
    Status publish(const Origin& origin);
    Status publish(WriteTxn& txn, const Origin& origin);
    // Publishes the content and keeps the lease: more writes may follow (close of
    // one of several descriptors, fsync). A no-op when nothing changed since.
    // `first`, if set, runs first in the same transaction: what must commit with the
    // new content or not at all (a hold on the content it replaces, core/holds.hpp).
    Status commit(const Origin& origin, const std::function<Status(WriteTxn&)>& first = {});
    // Releases the lease without publishing.
    Status abandon();
    // Drops this object without touching the db (its lease was never committed).
    void forget() { m_open = false; }

  private:
    StagedFile(Store* store, Ino ino);  // empty content, its lease taken by begin()
    // Reads the content begin() left in the db (see content()), unless the change about
    // to be made overwrites its first `overwritten` bytes and they are all of it.
    Status load(std::uint64_t overwritten = 0);
    void changed(std::uint64_t from, std::uint64_t to);  // bytes [from, to) changed
    // Tells the mirror of a change: `change` once it holds the content, else reset().
    void mirror(const std::function<Status(StagedMirror&)>& change);
    ops::ContentDigests digests();
    Result<Attr> store_content(WriteTxn& txn, const Origin& origin);
    Store* m_store = nullptr;
    Ino m_ino = 0;
    std::string m_content;  // only once m_loaded
    bool m_loaded = true;
    // The size of the version begun from (or adopted by load()): size() until loaded.
    std::uint64_t m_unloaded_size = 0;
    // Segmented content (kSegmentedSize or more): each segment's digest while it is
    // known unchanged since begin or the last publish, empty once written to.
    std::vector<Digest> m_segments;
    Digest m_stored;
    bool m_dirty = false;
    bool m_open = false;  // holds a lease
    std::uint64_t m_max_size = 0;
    std::shared_ptr<StagedMirror> m_mirror;  // null: none, or dropped
    bool m_mirrored = false;                 // m_mirror holds the content
};

}  // namespace kcache::core
