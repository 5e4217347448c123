// kcache-bench-floor-fsd: the FUSE floor. A minimal in-memory libfuse3 low-level
// daemon that makes the SAME protocol choices as kcache-fsd (fsd/src/handlers/filesystem.cpp
// init(), timeouts, open flags) and does nothing else: no LMDB, no accounting, no
// notifications. What a flow costs here is what the kernel <-> daemon round trips
// cost; what kcache-fsd costs above it is kcache's own work (issue 12).
//
// It counts requests per opcode (named as libfuse's -d log names them, so the
// counts compare with a `kcache-fsd -d` log line for line) and writes them to
// --counts FILE when the loop ends (SIGTERM/SIGINT, unmount) and on SIGUSR1.
//
// Usage: kcache-bench-floor-fsd [--counts FILE] [-d] MOUNTPOINT   (stays in the foreground)
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <linux/falloc.h>
#include <pthread.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "counters.hpp"

namespace {
using namespace kcache::floor_fsd;

// ---- protocol choices: kcache-fsd's, copied (fsd/src/handlers/filesystem.cpp, as of the
// issue-11 merge dfb158f: atomic O_TRUNC, writers through the page cache) -----------
constexpr double kEntryTimeout = 86400;
constexpr double kDirAttrTimeout = 86400;
constexpr double kNegativeTimeout = 86400;
constexpr double kFileAttrTimeout = 0;  // kcache-fsd: another process may replace content

// ---- the in-memory tree -----------------------------------------------------------
struct Node {
    fuse_ino_t ino = 0;
    mode_t mode = 0;
    nlink_t nlink = 1;
    uid_t uid = 0;
    gid_t gid = 0;
    timespec atime{}, mtime{}, ctime{};
    // A file's bytes. Copy-on-write: a read takes a reference under the lock and
    // replies without it; a writer copies first if a read still holds the old bytes.
    // A symlink's target is its data (its size is the target's length, as stat says).
    std::shared_ptr<std::string> data = std::make_shared<std::string>();
    std::map<std::string, std::string> xattrs;
    dev_t rdev = 0;                              // mknod: a device's number
    std::map<std::string, fuse_ino_t> children;  // directories
    std::uint64_t lookups = 0;                   // the kernel's references (freed by FORGET)
    unsigned opens = 0;
    unsigned writers = 0;  // open for writing: a second writer shares their page cache
};

std::mutex g_mutex;  // one lock for the tree: the floor is about round trips, not locking
std::unordered_map<fuse_ino_t, std::unique_ptr<Node>> g_nodes;
fuse_ino_t g_next_ino = FUSE_ROOT_ID + 1;

timespec now() {
    timespec t{};
    clock_gettime(CLOCK_REALTIME, &t);
    return t;
}

Node* node(fuse_ino_t ino) {
    auto it = g_nodes.find(ino);
    return it == g_nodes.end() ? nullptr : it->second.get();
}

Node& make_node(mode_t mode, const fuse_ctx* ctx) {
    auto n = std::make_unique<Node>();
    n->ino = g_next_ino++;
    n->mode = mode;
    n->nlink = S_ISDIR(mode) ? 2 : 1;
    n->uid = ctx->uid;
    n->gid = ctx->gid;
    n->atime = n->mtime = n->ctime = now();
    Node& ref = *n;
    g_nodes.emplace(ref.ino, std::move(n));
    return ref;
}

// A node goes when no name, no kernel reference and no open handle is left.
void maybe_free(Node* n) {
    if (n && n->ino != FUSE_ROOT_ID && n->nlink == 0 && n->lookups == 0 && n->opens == 0)
        g_nodes.erase(n->ino);
}

struct stat to_stat(const Node& n) {
    struct stat st {};
    st.st_ino = n.ino;
    st.st_mode = n.mode;
    st.st_nlink = n.nlink;
    st.st_rdev = n.rdev;
    st.st_uid = n.uid;
    st.st_gid = n.gid;
    st.st_size = static_cast<off_t>(n.data->size());
    st.st_blksize = 4096;
    st.st_blocks = static_cast<blkcnt_t>((n.data->size() + 511) / 512);
    st.st_atim = n.atime;
    st.st_mtim = n.mtime;
    st.st_ctim = n.ctime;
    return st;
}

double attr_timeout(const Node& n) {
    return S_ISDIR(n.mode) ? kDirAttrTimeout : kFileAttrTimeout;
}

// A node's bytes to change: copied first if a read still holds them (see Node).
std::string& writable_data(Node& n) {
    if (n.data.use_count() > 1) n.data = std::make_shared<std::string>(*n.data);
    return *n.data;
}

// Every entry handed to the kernel is a reference it will FORGET.
fuse_entry_param entry_of(Node& n) {
    fuse_entry_param e{};
    e.ino = n.ino;
    e.generation = 1;
    e.attr = to_stat(n);
    e.attr_timeout = attr_timeout(n);
    e.entry_timeout = kEntryTimeout;
    ++n.lookups;
    return e;
}

// Drops the name's link; the node lives on while referenced or open.
void unlink_child(Node& dir, std::map<std::string, fuse_ino_t>::iterator it) {
    Node* child = node(it->second);
    dir.children.erase(it);
    dir.mtime = dir.ctime = now();
    if (!child) return;
    if (S_ISDIR(child->mode)) --dir.nlink;
    child->nlink = S_ISDIR(child->mode) ? 0 : child->nlink - 1;  // files may have more names
    child->ctime = now();
    maybe_free(child);
}

// ---- operations -------------------------------------------------------------------
void op_init(void*, fuse_conn_info* conn) {
    conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;  // O_TRUNC comes with OPEN: no separate SETATTR
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  // kcache publishes on close: writes go through now
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    conn->max_write = 1 << 20;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    count(LOOKUP);
    std::unique_lock lock(g_mutex);
    Node* dir = node(parent);
    if (!dir) return (void)fuse_reply_err(req, ENOENT);
    auto it = dir->children.find(name);
    if (it == dir->children.end()) {
        fuse_entry_param e{};  // ino 0: a negative entry the kernel caches, as kcache-fsd's
        e.entry_timeout = kNegativeTimeout;
        lock.unlock();
        return (void)fuse_reply_entry(req, &e);
    }
    const fuse_entry_param e = entry_of(*node(it->second));
    lock.unlock();
    fuse_reply_entry(req, &e);
}

void forget_one(fuse_ino_t ino, std::uint64_t n) {
    Node* nd = node(ino);
    if (!nd) return;
    nd->lookups -= std::min(nd->lookups, n);
    maybe_free(nd);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, std::uint64_t n) {
    count(FORGET);
    {
        std::lock_guard lock(g_mutex);
        forget_one(ino, n);
    }
    fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count_, fuse_forget_data* forgets) {
    count(BATCH_FORGET);
    {
        std::lock_guard lock(g_mutex);
        for (size_t i = 0; i < count_; ++i) forget_one(forgets[i].ino, forgets[i].nlookup);
    }
    fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    count(GETATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    const struct stat st = to_stat(*n);
    const double timeout = attr_timeout(*n);
    lock.unlock();
    fuse_reply_attr(req, &st, timeout);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
    count(SETATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    const timespec t = now();
    if (to_set & FUSE_SET_ATTR_MODE) n->mode = (n->mode & S_IFMT) | (attr->st_mode & 07777);
    if (to_set & FUSE_SET_ATTR_UID) n->uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) n->gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_SIZE) {
        if (S_ISDIR(n->mode)) return (void)fuse_reply_err(req, EISDIR);
        auto copy = std::make_shared<std::string>(*n->data);  // copy-on-write, see Node
        copy->resize(static_cast<size_t>(attr->st_size));
        n->data = std::move(copy);
        n->mtime = t;
    }
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        n->atime = t;
    else if (to_set & FUSE_SET_ATTR_ATIME)
        n->atime = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        n->mtime = t;
    else if (to_set & FUSE_SET_ATTR_MTIME)
        n->mtime = attr->st_mtim;
    n->ctime = t;
    const struct stat st = to_stat(*n);
    const double timeout = attr_timeout(*n);
    lock.unlock();
    fuse_reply_attr(req, &st, timeout);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
    count(MKDIR);
    std::unique_lock lock(g_mutex);
    Node* dir = node(parent);
    if (!dir || !S_ISDIR(dir->mode)) return (void)fuse_reply_err(req, ENOENT);
    if (dir->children.count(name)) return (void)fuse_reply_err(req, EEXIST);
    Node& n = make_node(S_IFDIR | (mode & 07777), fuse_req_ctx(req));
    dir->children.emplace(name, n.ino);
    ++dir->nlink;
    dir->mtime = dir->ctime = n.ctime;
    const fuse_entry_param e = entry_of(n);
    lock.unlock();
    fuse_reply_entry(req, &e);
}

void remove_name(fuse_req_t req, fuse_ino_t parent, const char* name, bool want_dir) {
    std::unique_lock lock(g_mutex);
    Node* dir = node(parent);
    if (!dir) return (void)fuse_reply_err(req, ENOENT);
    auto it = dir->children.find(name);
    if (it == dir->children.end()) return (void)fuse_reply_err(req, ENOENT);
    Node* child = node(it->second);
    if (child && S_ISDIR(child->mode) != want_dir)
        return (void)fuse_reply_err(req, want_dir ? ENOTDIR : EISDIR);
    if (child && want_dir && !child->children.empty()) return (void)fuse_reply_err(req, ENOTEMPTY);
    unlink_child(*dir, it);
    lock.unlock();
    fuse_reply_err(req, 0);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
    count(UNLINK);
    remove_name(req, parent, name, false);
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
    count(RMDIR);
    remove_name(req, parent, name, true);
}

// rename(2) arrives as RENAME (flags 0), renameat2() with flags as RENAME2.
void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned int flags) {
    count(flags ? RENAME2 : RENAME);
    if (flags & ~RENAME_NOREPLACE)
        return (void)fuse_reply_err(req, EINVAL);  // no EXCHANGE/WHITEOUT
    std::unique_lock lock(g_mutex);
    Node* from = node(parent);
    Node* to = node(newparent);
    if (!from || !to) return (void)fuse_reply_err(req, ENOENT);
    auto src = from->children.find(name);
    if (src == from->children.end()) return (void)fuse_reply_err(req, ENOENT);
    const fuse_ino_t moved = src->second;
    auto dst = to->children.find(newname);
    if (dst != to->children.end()) {
        if (dst->second == moved) return (void)fuse_reply_err(req, 0);
        if (flags & RENAME_NOREPLACE) return (void)fuse_reply_err(req, EEXIST);
        Node* old = node(dst->second);
        Node* mv = node(moved);
        if (old && mv && S_ISDIR(old->mode) != S_ISDIR(mv->mode)) {
            return (void)fuse_reply_err(req, S_ISDIR(old->mode) ? EISDIR : ENOTDIR);
        }
        if (old && S_ISDIR(old->mode) && !old->children.empty())
            return (void)fuse_reply_err(req, ENOTEMPTY);
        unlink_child(*to, dst);
    }
    from->children.erase(src);
    to->children[newname] = moved;
    if (Node* mv = node(moved); mv && S_ISDIR(mv->mode) && from != to) {
        --from->nlink;
        ++to->nlink;
    }
    from->mtime = from->ctime = to->mtime = to->ctime = now();
    lock.unlock();
    fuse_reply_err(req, 0);
}

// A new name for a new node (mknod, symlink); the caller holds the lock.
void reply_new_node(fuse_req_t req, std::unique_lock<std::mutex>& lock, fuse_ino_t parent,
                    const char* name, mode_t mode, dev_t rdev, const char* target) {
    Node* dir = node(parent);
    if (!dir || !S_ISDIR(dir->mode)) return (void)fuse_reply_err(req, ENOENT);
    if (dir->children.count(name)) return (void)fuse_reply_err(req, EEXIST);
    Node& n = make_node(mode, fuse_req_ctx(req));
    n.rdev = rdev;
    if (target) *n.data = target;
    dir->children.emplace(name, n.ino);
    dir->mtime = dir->ctime = n.ctime;
    const fuse_entry_param e = entry_of(n);
    lock.unlock();
    fuse_reply_entry(req, &e);
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
    count(MKNOD);
    std::unique_lock lock(g_mutex);
    reply_new_node(req, lock, parent, name, mode, rdev, nullptr);
}

void op_symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
    count(SYMLINK);
    std::unique_lock lock(g_mutex);
    reply_new_node(req, lock, parent, name, S_IFLNK | 0777, 0, target);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
    count(READLINK);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n || !S_ISLNK(n->mode)) return (void)fuse_reply_err(req, n ? EINVAL : ENOENT);
    const std::string target = *n->data;
    lock.unlock();
    fuse_reply_readlink(req, target.c_str());
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
    count(LINK);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    Node* dir = node(newparent);
    if (!n || !dir || !S_ISDIR(dir->mode)) return (void)fuse_reply_err(req, ENOENT);
    if (S_ISDIR(n->mode)) return (void)fuse_reply_err(req, EPERM);
    if (dir->children.count(newname)) return (void)fuse_reply_err(req, EEXIST);
    dir->children.emplace(newname, n->ino);
    ++n->nlink;
    n->ctime = dir->mtime = dir->ctime = now();
    const fuse_entry_param e = entry_of(*n);
    lock.unlock();
    fuse_reply_entry(req, &e);
}

// Extended attributes in memory, with the errors kcache-fsd gives (the kernel asks for
// security.capability before every write: ENODATA here as there, a round trip each).
void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                 int flags) {
    count(SETXATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    const bool exists = n->xattrs.count(name) != 0;
    if ((flags & XATTR_CREATE) && exists) return (void)fuse_reply_err(req, EEXIST);
    if ((flags & XATTR_REPLACE) && !exists) return (void)fuse_reply_err(req, ENODATA);
    n->xattrs[name].assign(value, size);
    n->ctime = now();
    lock.unlock();
    fuse_reply_err(req, 0);
}

// A value or list: its size when the caller asks for none, ERANGE when it does not fit.
void reply_xattr_bytes(fuse_req_t req, const std::string& bytes, size_t size) {
    if (size == 0) return (void)fuse_reply_xattr(req, bytes.size());
    if (bytes.size() > size) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, bytes.data(), bytes.size());
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    count(GETXATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    auto it = n->xattrs.find(name);
    if (it == n->xattrs.end()) return (void)fuse_reply_err(req, ENODATA);
    const std::string value = it->second;
    lock.unlock();
    reply_xattr_bytes(req, value, size);
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    count(LISTXATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    std::string list;
    for (const auto& [name, value] : n->xattrs) list.append(name).push_back('\0');
    lock.unlock();
    reply_xattr_bytes(req, list, size);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
    count(REMOVEXATTR);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    if (n->xattrs.erase(name) == 0) return (void)fuse_reply_err(req, ENODATA);
    n->ctime = now();
    lock.unlock();
    fuse_reply_err(req, 0);
}

// The modes kcache-fsd serves (fsd/src/handlers/fallocate.cpp): reserve (0, KEEP_SIZE), and
// PUNCH_HOLE (with KEEP_SIZE) and ZERO_RANGE, whose bytes read as zeros.
void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                  fuse_file_info*) {
    count(FALLOCATE);
    const bool keep_size = (mode & FALLOC_FL_KEEP_SIZE) != 0;
    const bool punch = (mode & FALLOC_FL_PUNCH_HOLE) != 0;
    const bool zero = (mode & FALLOC_FL_ZERO_RANGE) != 0;
    if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
        return (void)fuse_reply_err(req, EOPNOTSUPP);
    if (punch && !keep_size) return (void)fuse_reply_err(req, EOPNOTSUPP);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    std::string& d = writable_data(*n);
    const size_t end = static_cast<size_t>(offset + length);
    if (punch || zero) {
        const size_t stop = std::min(end, d.size());
        if (static_cast<size_t>(offset) < stop)
            std::memset(d.data() + offset, 0, stop - static_cast<size_t>(offset));
    }
    if (!keep_size && d.size() < end) d.resize(end);
    n->mtime = n->ctime = now();
    lock.unlock();
    fuse_reply_err(req, 0);
}

// Readers: keep_cache (pages survive the next open) and noflush (no FLUSH at close).
// Writers: through the page cache (write-through: no writeback cache), keeping it
// only when they join another writer of the file, as kcache-fsd's shared version;
// a new version drops what the cache held. Called with the lock held.
void set_open_flags(Node& n, fuse_file_info* fi) {
    const bool writing = (fi->flags & O_ACCMODE) != O_RDONLY;
    fi->direct_io = 0;
    fi->keep_cache = !writing || n.writers > 0;
    fi->noflush = !writing;
    ++n.opens;
    if (writing) ++n.writers;
}

void release_node(Node* n, const fuse_file_info* fi) {
    --n->opens;
    if ((fi->flags & O_ACCMODE) != O_RDONLY) --n->writers;
    maybe_free(n);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    count(OPEN);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    if (S_ISDIR(n->mode)) return (void)fuse_reply_err(req, EISDIR);
    if ((fi->flags & O_ACCMODE) != O_RDONLY && (fi->flags & O_TRUNC)) {  // atomic O_TRUNC
        n->data = std::make_shared<std::string>();
        n->mtime = n->ctime = now();
    }
    set_open_flags(*n, fi);
    lock.unlock();
    if (fuse_reply_open(req, fi) != 0) {  // the opener is gone (interrupted): no RELEASE comes
        std::lock_guard relock(g_mutex);
        if (Node* again = node(ino)) release_node(again, fi);
    }
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
    count(CREATE);
    std::unique_lock lock(g_mutex);
    Node* dir = node(parent);
    if (!dir || !S_ISDIR(dir->mode)) return (void)fuse_reply_err(req, ENOENT);
    Node* n = nullptr;
    if (auto it = dir->children.find(name);
        it != dir->children.end()) {  // raced with another creator
        if (fi->flags & O_EXCL) return (void)fuse_reply_err(req, EEXIST);
        n = node(it->second);
        if (fi->flags & O_TRUNC) n->data = std::make_shared<std::string>();
    } else {
        n = &make_node(S_IFREG | (mode & 07777), fuse_req_ctx(req));
        dir->children.emplace(name, n->ino);
        dir->mtime = dir->ctime = n->ctime;
    }
    set_open_flags(*n, fi);
    const fuse_entry_param e = entry_of(*n);
    lock.unlock();
    fuse_reply_create(req, &e, fi);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    count(READ);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    std::shared_ptr<const std::string> data = n->data;  // held for the reply, lock released
    lock.unlock();
    const size_t at = std::min(static_cast<size_t>(off), data->size());
    fuse_reply_buf(req, data->data() + at, std::min(size, data->size() - at));
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
              fuse_file_info*) {
    count(WRITE);
    std::unique_lock lock(g_mutex);
    Node* n = node(ino);
    if (!n) return (void)fuse_reply_err(req, ENOENT);
    std::string& d = writable_data(*n);
    const size_t end = static_cast<size_t>(off) + size;
    if (d.size() < end) d.resize(end);
    std::memcpy(d.data() + off, buf, size);
    n->mtime = n->ctime = now();
    lock.unlock();
    fuse_reply_write(req, size);
}

void op_flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    count(FLUSH);
    fuse_reply_err(req, 0);  // nothing to publish: kcache-fsd's flush is where it would
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    count(RELEASE);
    {
        std::lock_guard lock(g_mutex);
        if (Node* n = node(ino)) release_node(n, fi);
    }
    fuse_reply_err(req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
    count(FSYNC);
    fuse_reply_err(req, 0);  // memory is as durable as it gets
}

void op_opendir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
    count(OPENDIR);
    fuse_reply_open(req, fi);
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    count(RELEASEDIR);
    fuse_reply_err(req, 0);
}

void op_fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
    count(FSYNCDIR);
    fuse_reply_err(req, 0);
}

// Offsets are positions in the (sorted) listing: ".", "..", then the children. Good
// enough for a bench; a listing changed between two calls may skip or repeat a name.
void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
    count(plus ? READDIRPLUS : READDIR);
    std::lock_guard lock(g_mutex);
    Node* dir = node(ino);
    if (!dir || !S_ISDIR(dir->mode)) return (void)fuse_reply_err(req, ENOTDIR);
    std::vector<char> buf(size);
    size_t used = 0;
    off_t pos = 0;
    auto add = [&](const char* name, Node& n, bool counted) {
        ++pos;
        if (pos <= off) return true;
        const size_t room = size - used;
        size_t need;
        if (plus) {
            fuse_entry_param e{};
            e.ino = n.ino;
            e.attr = to_stat(n);
            e.attr_timeout = attr_timeout(n);
            e.entry_timeout = kEntryTimeout;
            need = fuse_add_direntry_plus(req, buf.data() + used, room, name, &e, pos);
            if (need <= room && counted) ++n.lookups;  // "." and ".." take no reference
        } else {
            const struct stat st = to_stat(n);
            need = fuse_add_direntry(req, buf.data() + used, room, name, &st, pos);
        }
        if (need > room) return false;
        used += need;
        return true;
    };
    if (!add(".", *dir, false) || !add("..", *dir, false))
        return (void)fuse_reply_buf(req, buf.data(), used);
    for (const auto& [name, child] : dir->children) {
        if (Node* n = node(child); n && !add(name.c_str(), *n, true)) break;
    }
    fuse_reply_buf(req, buf.data(), used);  // under the lock: a readdir reply is small
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
    count(STATFS);
    struct statvfs out {};
    out.f_bsize = out.f_frsize = 4096;
    out.f_blocks = out.f_bfree = out.f_bavail = 1u << 20;  // 4 GiB, all free: it is a bench
    out.f_files = out.f_ffree = out.f_favail = 1u << 20;
    out.f_namemax = 255;
    fuse_reply_statfs(req, &out);
}

// What kcache-fsd leaves unimplemented, libfuse answers ENOSYS without calling us; so
// do these, the same answer, only counted (Python's open() sends an IOCTL per file
// for isatty(), and the kernel does not remember an ENOSYS for ioctl as it does for
// access and lseek). Setting them changes nothing libfuse
// negotiates at INIT (lock handlers would; none are set).
void enosys(fuse_req_t req, Op op) {
    count(op);
    fuse_reply_err(req, ENOSYS);
}

// SIGUSR1 -> counts written, by a thread of ours (a signal handler cannot write files).
void counts_on_request() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    for (int sig = 0;;) {
        if (sigwait(&set, &sig) == 0) write_counts();
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> fuse_argv_storage{argv[0], "-o", "fsname=floor,subtype=floor"};
    std::string mountpoint;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--counts" && i + 1 < argc)
            set_counts_path(argv[++i]);
        else if (a == "-d")
            fuse_argv_storage.push_back("-d");  // libfuse logs every request
        else if (!a.empty() && a[0] != '-' && mountpoint.empty())
            mountpoint = a;
        else {
            std::fprintf(stderr, "usage: %s [--counts FILE] [-d] MOUNTPOINT\n", argv[0]);
            return 2;
        }
    }
    if (mountpoint.empty()) {
        std::fprintf(stderr, "usage: %s [--counts FILE] [-d] MOUNTPOINT\n", argv[0]);
        return 2;
    }

    // SIGUSR1 blocked in every thread (the loop's workers inherit the mask) but ours.
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    std::thread(counts_on_request).detach();

    auto root = std::make_unique<Node>();
    root->ino = FUSE_ROOT_ID;
    root->mode = S_IFDIR | 0755;
    root->nlink = 2;
    root->uid = getuid();
    root->gid = getgid();
    root->atime = root->mtime = root->ctime = now();
    g_nodes.emplace(FUSE_ROOT_ID, std::move(root));

    fuse_lowlevel_ops ops{};
    ops.init = op_init;
    ops.lookup = op_lookup;
    ops.forget = op_forget;
    ops.forget_multi = op_forget_multi;
    ops.getattr = op_getattr;
    ops.setattr = op_setattr;
    ops.mkdir = op_mkdir;
    ops.unlink = op_unlink;
    ops.rmdir = op_rmdir;
    ops.rename = op_rename;
    ops.open = op_open;
    ops.create = op_create;
    ops.read = op_read;
    ops.write = op_write;
    ops.flush = op_flush;
    ops.release = op_release;
    ops.fsync = op_fsync;
    ops.opendir = op_opendir;
    ops.releasedir = op_releasedir;
    ops.fsyncdir = op_fsyncdir;
    ops.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info*) {
        readdir(r, i, s, o, false);
    };
    ops.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info*) {
        readdir(r, i, s, o, true);
    };
    ops.statfs = op_statfs;
    ops.ioctl = [](fuse_req_t r, fuse_ino_t, unsigned int, void*, fuse_file_info*, unsigned,
                   const void*, size_t, size_t) { enosys(r, IOCTL); };
    ops.getxattr = op_getxattr;
    ops.setxattr = op_setxattr;
    ops.listxattr = op_listxattr;
    ops.removexattr = op_removexattr;
    ops.mknod = op_mknod;
    ops.symlink = op_symlink;
    ops.readlink = op_readlink;
    ops.link = op_link;
    ops.access = [](fuse_req_t r, fuse_ino_t, int) { enosys(r, ACCESS); };
    ops.fallocate = op_fallocate;
    ops.lseek = [](fuse_req_t r, fuse_ino_t, off_t, int, fuse_file_info*) { enosys(r, LSEEK); };
    // No lock operations, as kcache-fsd: the kernel keeps flock()/fcntl() locks itself.

    std::vector<char*> fuse_argv;
    for (auto& a : fuse_argv_storage) fuse_argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
    fuse_session* session = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
    if (!session) return 1;
    if (fuse_set_signal_handlers(session) != 0 ||
        fuse_session_mount(session, mountpoint.c_str()) != 0) {
        fuse_session_destroy(session);
        return 1;
    }
    // The same loop as kcache-fsd's main(): multi-threaded, up to 16 workers, one fd.
    fuse_loop_config* loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(loop, 0);
    fuse_loop_cfg_set_max_threads(loop, 16);
    const int rc = fuse_session_loop_mt(session, loop);
    fuse_loop_cfg_destroy(loop);
    write_counts();
    fuse_session_unmount(session);
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    fuse_opt_free_args(&args);
    return rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP ? 0 : 1;
}
