// The FUSE filesystem over a kcache store (libfuse3 low-level API).
//
// Inode numbers are the store's: stable, never reused, so the daemon keeps no
// per-inode state and needs no FORGET bookkeeping. State lives in open handles:
// - a reader's handle holds a snapshot of the content it opened (shared between
//   handles of the same content), so an unlink or eviction never breaks a read;
// - a writer's handle holds a core::StagedFile: writes go to memory and are
//   published atomically when the file is flushed (close), so readers see the old
//   or the new complete content.
// - a file removed (unlink, rename over it) while the kernel still knows its inode
//   stays readable as an orphan until the kernel forgets it, as an unlinked inode
//   does on a local disk; writes to it are accepted and dropped.
// Caching: entries and directory attributes are cached by the kernel for a long
// time and invalidated explicitly (Background). File attributes are not cached
// (timeout 0); getattr answers with the open handle's view, or the newest staged
// writer's. Writers, and readers that open while a writer is at work, use direct
// I/O: the writer's bytes never enter the page cache other readers share, and a
// reader's reads end where its own version ends. The kernel's one size per inode is
// the last shared thing: a writer's open waits (at most kWriterWait) until readers
// of other processes that read the inode through the page cache have closed.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "background.hpp"
#include "kcache/core/store.hpp"
#include "options.hpp"

namespace kcache::fsd {

class Filesystem {
public:
    Filesystem(core::Store& store, const Options& options);
    ~Filesystem();

    // The operation table; every callback's userdata is a Filesystem*.
    static const fuse_lowlevel_ops& operations();

    void start(fuse_session* session);
    void stop() { m_background.stop(); }

    // ---- handlers (called from libfuse's worker threads) ----
    void init(fuse_conn_info* conn);
    void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
    void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
    void readlink(fuse_req_t req, fuse_ino_t ino);
    void mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
    void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
    void unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
    void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
    void symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name);
    void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
                const char* new_name, unsigned int flags);
    void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name);
    void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
    void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
    void write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
               fuse_file_info* fi);
    void flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
    void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi,
                 bool plus);
    void releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
    void statfs(fuse_req_t req, fuse_ino_t ino);
    void forget(fuse_ino_t ino, std::uint64_t count);

private:
    struct FileHandle;
    struct DirHandle;

    struct Orphan {
        core::Attr attr;
        std::shared_ptr<const std::string> content;
    };

    void reply_error(fuse_req_t req, const core::Error& error);
    // Makes a node in one transaction and replies with its entry.
    void make_node(fuse_req_t req,
                   const std::function<core::Result<core::Attr>(core::WriteTxn&, const fuse_ctx&)>& make);
    // Replies with an entry the kernel now holds a lookup reference on.
    void reply_entry(fuse_req_t req, const core::Attr& attr);
    void remember_lookup(core::Ino ino);
    // Before a removal: keeps the content of `name` in `parent` if the kernel knows it.
    std::optional<std::pair<core::Ino, Orphan>> orphan_of(const core::ReadTxn& txn, core::Ino parent,
                                                          const char* name);
    void adopt(std::optional<std::pair<core::Ino, Orphan>>& orphan);
    void disown(const std::optional<std::pair<core::Ino, Orphan>>& orphan);
    // Runs `remove` (an unlink, or a rename over `name`) in one transaction, keeping
    // the removed file readable as an orphan while the kernel still knows it.
    core::Status remove_keeping_orphan(core::Ino parent, const char* name,
                                       const std::function<core::Status(core::WriteTxn&)>& remove);
    std::optional<Orphan> find_orphan(core::Ino ino);
    // Attributes of a file removed from the db that a handle, orphan or writer still holds.
    std::optional<core::Attr> removed_attr(core::Ino ino, FileHandle* handle);
    // The size staged by the newest writer of `ino` that `process` opened, if any.
    std::optional<std::uint64_t> staged_size(core::Ino ino, std::uint32_t process);
    // Applies a SETATTR(size 0) that follows open(O_TRUNC) to the opener's fresh writer.
    bool take_open_truncate(core::Ino ino, std::uint32_t process);
    // Applies a truncate by path to every open writer's staged content.
    void truncate_writers(core::Ino ino, std::uint64_t size);
    void add_writer(FileHandle* handle);
    void remove_writer(FileHandle* handle);
    // Publishes a writer's content, first making room under the size bound.
    core::Status publish(fuse_req_t req, FileHandle& handle);
    // The page cache of an inode, and the kernel's size of it, are shared by all its
    // readers: at most one version at a time is read through them, and while it is,
    // the kernel's size must stay that version's. enter_pages says how `reader` (a new
    // handle of `digest`) may use them: not at all while a writer is at work (its
    // writes move the kernel's size) or another version's readers read.
    enum class PageUse { keep, refill, direct };
    PageUse enter_pages(FileHandle* reader, const core::Digest& digest);
    void leave_pages(FileHandle* reader);
    // The size of the version being read through the page cache of `ino`, if any.
    std::optional<std::uint64_t> page_cache_size(core::Ino ino);
    // Answers a writer's open (`reply`) now, or once the readers that other processes
    // have reading its inode through the page cache have closed: its writes would
    // grow the size those readers read up to, and they would read zeros. Readers that
    // outlast kWriterWait (an mmap kept for long) no longer hold it up; the writer
    // gate thread answers then. Only for OPEN: a CREATE is answered while the kernel
    // holds its directory's lock, which the background thread's notifications take.
    void admit_writer(FileHandle* writer, std::function<void()> reply);
    // Counts a writer of its inode in (new readers then read directly) and returns the
    // readers already reading through the page cache, with the threads that opened them.
    std::vector<std::pair<FileHandle*, pid_t>> enter_pages_as_writer(FileHandle* writer);
    void leave_pages_as_writer(FileHandle* writer);
    void run_writer_gate();
    // Undoes an open whose reply the kernel did not take (the opener was interrupted).
    void discard_open(FileHandle* handle);
    std::shared_ptr<const std::string> snapshot(const core::Digest& digest, std::string_view bytes);
    void count_open(fuse_req_t req, const core::ReadTxn& txn, const core::Attr& attr);

    core::Store& m_store;
    const Options m_options;
    Background m_background;

    struct PageState {
        core::Digest digest;                // the version whose pages the kernel caches
        std::uint64_t size = 0;             // its size
        std::vector<FileHandle*> readers;   // open handles reading through the page cache
        std::uint32_t writers = 0;          // open writer handles: no reader enters meanwhile
    };
    struct WaitingWriter {
        FileHandle* writer;
        std::vector<FileHandle*> readers;  // still open: the writer's open waits for them
        std::chrono::steady_clock::time_point deadline;
        std::function<void()> reply;
    };
    static constexpr auto kWriterWait = std::chrono::seconds(2);
    std::mutex m_pages_mutex;  // a leaf: nothing else is locked while it is held
    std::unordered_map<core::Ino, PageState> m_pages;
    std::vector<WaitingWriter> m_waiting_writers;
    std::condition_variable m_writer_gate_wake;  // a writer waits, or stop
    bool m_writer_gate_stop = false;
    std::thread m_writer_gate;

    std::mutex m_snapshots_mutex;  // content shared by reader handles
    std::unordered_map<std::string, std::weak_ptr<const std::string>> m_snapshots;

    std::mutex m_seen_mutex;  // (entry, process) pairs that counted their hit
    std::unordered_set<std::string> m_seen;

    std::mutex m_lookups_mutex;  // kernel lookup references, and orphans they keep alive
    std::unordered_map<core::Ino, std::uint64_t> m_lookups;
    std::unordered_map<core::Ino, Orphan> m_orphans;

    std::mutex m_writers_mutex;  // open writer handles per inode
    std::unordered_map<core::Ino, std::vector<FileHandle*>> m_writers;
    std::atomic<std::uint64_t> m_write_clock{0};
};

}  // namespace kcache::fsd
