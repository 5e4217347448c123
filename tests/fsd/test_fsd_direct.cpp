// Drives kcache::fsd::Filesystem's handlers directly, without a mount: this program
// defines the libfuse calls the handlers make (replies, the request's context), so a
// test can run handlers on threads of its choosing and race them as no kernel would
// schedule them on demand. The background thread runs without a session: it notifies
// nobody, but still runs what waits for its notifications.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "filesystem.hpp"
#include "kcache/core/store.hpp"
#include "temp_dir.hpp"

// What a handler answered. libfuse's own struct is private to it; this program
// never links its definitions of the calls below.
struct fuse_req {
    fuse_ctx ctx{};
    void* userdata = nullptr;
    std::mutex mutex;  // a reply may come from another thread (admit_writer, the background)
    bool replied = false;
    int err = 0;
    fuse_file_info fi{};
    fuse_entry_param entry{};
    struct stat attr {};
    std::string buf;
};

namespace {
int answer(fuse_req_t req, int err) {
    std::lock_guard lock(req->mutex);
    req->replied = true;
    req->err = err;
    return 0;
}
}  // namespace

extern "C" {
const struct fuse_ctx* fuse_req_ctx(fuse_req_t req) {
    return &req->ctx;
}
void* fuse_req_userdata(fuse_req_t req) {
    return req->userdata;
}
int fuse_reply_err(fuse_req_t req, int err) {
    return answer(req, err);
}
int fuse_reply_open(fuse_req_t req, const struct fuse_file_info* fi) {
    req->fi = *fi;
    return answer(req, 0);
}
int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param* e,
                      const struct fuse_file_info* fi) {
    req->entry = *e;
    req->fi = *fi;
    return answer(req, 0);
}
int fuse_reply_entry(fuse_req_t req, const struct fuse_entry_param* e) {
    req->entry = *e;
    return answer(req, 0);
}
int fuse_reply_attr(fuse_req_t req, const struct stat* attr, double) {
    req->attr = *attr;
    return answer(req, 0);
}
int fuse_reply_write(fuse_req_t req, size_t) {
    return answer(req, 0);
}
int fuse_reply_buf(fuse_req_t req, const char* buf, size_t size) {
    req->buf.assign(buf, size);
    return answer(req, 0);
}
// Requests here are never interrupted (single flight registers for interrupts).
void fuse_req_interrupt_func(fuse_req_t, fuse_interrupt_func_t, void*) {}
}

namespace {

using kcache::core::Ino;
namespace fsd = kcache::fsd;

struct Direct {
    kcache::test::TempDir dir;
    std::unique_ptr<kcache::core::Store> store;
    std::unique_ptr<fsd::Filesystem> fs;

    Direct() {
        kcache::core::OpenOptions open;
        open.path = (dir / "db").string();
        open.durability = kcache::core::Durability::none;
        auto opened = kcache::core::Store::open(open);
        REQUIRE(opened);
        store = std::move(*opened);
        fsd::Options options;
        options.db = open.path;
        fs = std::make_unique<fsd::Filesystem>(*store, options);
        fs->start(nullptr);
    }
    ~Direct() { fs->stop(); }

    // A request from this thread, as the kernel would send it.
    std::unique_ptr<fuse_req> req() {
        auto r = std::make_unique<fuse_req>();
        r->ctx.pid = static_cast<pid_t>(::syscall(SYS_gettid));
        r->ctx.uid = ::getuid();
        r->ctx.gid = ::getgid();
        r->userdata = fs.get();
        return r;
    }

    // A file `name` in the root with `content`, stored as a compiler stores one
    // (create, write, release) by process `pid` (0: this one); its inode.
    Ino store_file(const char* name, const std::string& content, pid_t pid = 0) {
        auto made = req();
        if (pid != 0) made->ctx.pid = pid;
        fuse_file_info created{};
        created.flags = O_WRONLY | O_CREAT | O_TRUNC;
        fs->create(made.get(), kcache::core::kRootIno, name, S_IFREG | 0644, &created);
        REQUIRE(made->err == 0);
        auto written = req();
        if (pid != 0) written->ctx.pid = pid;
        fs->write(written.get(), made->entry.ino, content.data(), content.size(), 0, &made->fi);
        REQUIRE(written->err == 0);
        auto closed = req();
        if (pid != 0) closed->ctx.pid = pid;
        fs->release(closed.get(), made->entry.ino, &made->fi);
        return made->entry.ino;
    }

    std::string stored(Ino ino) const {
        auto txn = store->read();
        REQUIRE(txn);
        auto content = txn->read(ino);
        REQUIRE(content);
        return std::string(content->bytes());
    }
};

}  // namespace

TEST_CASE("a truncate by path racing the last writer's release is never lost", "[fsd][direct]") {
    Direct d;
    auto made = d.req();
    fuse_file_info created{};
    created.flags = O_WRONLY | O_CREAT | O_TRUNC;
    d.fs->create(made.get(), kcache::core::kRootIno, "kernel.bin", S_IFREG | 0644, &created);
    REQUIRE(made->replied);
    REQUIRE(made->err == 0);
    const Ino ino = made->entry.ino;
    auto closed = d.req();
    d.fs->release(closed.get(), ino, &made->fi);
    const std::string data(8192, 'k');
    // Each round: a writer of the shared version (no O_TRUNC, as a database's) writes
    // and its last handle is released (the release publishes), while another process
    // truncates the file by path, a little later each round so that the truncate
    // falls before, into and after the publish. Whatever the order, the truncate
    // comes after the write: the file ends empty.
    for (int round = 0; round < 3000; ++round) {
        INFO("round " << round);
        auto opened = d.req();
        fuse_file_info fi{};
        fi.flags = O_WRONLY;
        d.fs->open(opened.get(), ino, &fi);
        REQUIRE(opened->replied);
        REQUIRE(opened->err == 0);
        fuse_file_info handle = opened->fi;
        auto written = d.req();
        d.fs->write(written.get(), ino, data.data(), data.size(), 0, &handle);
        REQUIRE(written->err == 0);
        std::atomic<bool> go{false};
        std::thread releaser([&] {
            auto released = d.req();
            while (!go) {
            }
            d.fs->release(released.get(), ino, &handle);
        });
        auto truncated = d.req();
        go = true;
        std::atomic<int> spin{0};
        while (spin.fetch_add(1, std::memory_order_relaxed) < (round % 200) * 50) {
        }
        struct stat to {};
        to.st_size = 0;
        d.fs->setattr(truncated.get(), ino, &to, FUSE_SET_ATTR_SIZE, nullptr);
        releaser.join();
        REQUIRE(truncated->err == 0);
        REQUIRE(d.stored(ino).size() == 0);
    }
}

namespace {

// Waits for a handler's reply, which may come from another thread (the background).
bool replied_within(fuse_req& r, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        {
            std::lock_guard lock(r.mutex);
            if (r.replied) return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}

// An OPEN of `ino` with `flags` (by process `pid`, else this thread's), answered
// without error: its request, whose fi is the handle.
std::unique_ptr<fuse_req> open_file(Direct& d, Ino ino, int flags, pid_t pid = 0) {
    auto r = d.req();
    if (pid != 0) r->ctx.pid = pid;
    fuse_file_info fi{};
    fi.flags = flags;
    d.fs->open(r.get(), ino, &fi);
    REQUIRE(replied_within(*r, 10));
    REQUIRE(r->err == 0);
    return r;
}

// A process other than this one, for a request's pid: process_of tells it apart, as
// the daemon tells another compile apart. It waits until the end of the test.
struct OtherProcess {
    pid_t pid = -1;
    OtherProcess() {
        pid = ::fork();
        if (pid == 0) {
            ::pause();
            ::_exit(0);
        }
        REQUIRE(pid > 0);
    }
    ~OtherProcess() {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    OtherProcess(const OtherProcess&) = delete;
    OtherProcess& operator=(const OtherProcess&) = delete;
};

}  // namespace

TEST_CASE("no reader keeps the kernel's pages before a refilling reader's open has dropped them",
          "[fsd][direct]") {
    // The kernel drops an inode's pages when an open without keep_cache completes,
    // after the daemon's reply. A second reader told to keep the pages before that
    // could read another version's pages (a rewriter's, left in the page cache) and
    // stop at its own version's size: the soak saw such reads. Until a refilling
    // reader's first READ shows its open completed, every reader refills.
    Direct d;
    const std::string version(3 * 4096 + 100, 'v');
    const Ino ino = d.store_file("kernel.bin", version);

    auto open_reader = [&] {
        auto r = open_file(d, ino, O_RDONLY);
        REQUIRE(r->fi.direct_io == 0);  // no writer: every reader uses the page cache
        return r;
    };
    auto read_at = [&](fuse_req& opened, off_t off) {
        auto r = d.req();
        d.fs->read(r.get(), ino, 4096, off, &opened.fi);
        REQUIRE(r->err == 0);
        return r->buf;
    };
    auto release = [&](fuse_req& opened) {
        auto r = d.req();
        d.fs->release(r.get(), ino, &opened.fi);
    };

    auto first = open_reader();
    CHECK(first->fi.keep_cache == 0);  // the writer's pages are no known version
    auto second = open_reader();
    CHECK(second->fi.keep_cache == 0);  // the first open may not have dropped them yet
    CHECK(read_at(*first, 0) == version.substr(0, 4096));
    auto third = open_reader();
    CHECK(third->fi.keep_cache == 1);  // the first reader's READ: its open is done
    CHECK(read_at(*third, 3 * 4096) == version.substr(3 * 4096));  // loaded lazily
    release(*first);
    release(*second);
    release(*third);

    // A rewrite leaves its pages to the kernel: the next readers refill again.
    auto rewriter = open_file(d, ino, O_WRONLY | O_TRUNC);
    const std::string rewritten(100, 'r');
    auto rewrote = d.req();
    d.fs->write(rewrote.get(), ino, rewritten.data(), rewritten.size(), 0, &rewriter->fi);
    REQUIRE(rewrote->err == 0);
    auto rewrite_closed = d.req();
    d.fs->release(rewrite_closed.get(), ino, &rewriter->fi);
    auto fourth = open_reader();
    CHECK(fourth->fi.keep_cache == 0);
    auto fifth = open_reader();
    CHECK(fifth->fi.keep_cache == 0);
    CHECK(read_at(*fifth, 0) == rewritten);
    auto sixth = open_reader();
    CHECK(sixth->fi.keep_cache == 1);
    release(*fourth);
    release(*fifth);
    release(*sixth);
}

TEST_CASE("a reader opening between a writer's close and its release may map the file shared",
          "[fsd][direct]") {
    // close(2) returns after FLUSH (which publishes); RELEASE comes later, on its own.
    // A reader opening in between reads what was published: through the page cache,
    // not direct_io, with which the kernel refuses a MAP_SHARED mapping (ENODEV).
    Direct d;
    auto made = d.req();
    fuse_file_info created{};
    created.flags = O_WRONLY | O_CREAT | O_TRUNC;
    d.fs->create(made.get(), kcache::core::kRootIno, "kernel.hsaco", S_IFREG | 0644, &created);
    REQUIRE(made->err == 0);
    const Ino ino = made->entry.ino;
    fuse_file_info writer = made->fi;
    const std::string data(300 * 1024, 'h');
    auto written = d.req();
    d.fs->write(written.get(), ino, data.data(), data.size(), 0, &writer);
    REQUIRE(written->err == 0);

    auto still_writing = open_file(d, ino, O_RDONLY);
    CHECK(still_writing->fi.direct_io == 1);  // a rewrite at work: the reader bypasses its pages
    auto early_closed = d.req();
    d.fs->release(early_closed.get(), ino, &still_writing->fi);

    auto flushed = d.req();
    d.fs->flush(flushed.get(), ino, &writer);
    REQUIRE(flushed->err == 0);
    REQUIRE(d.stored(ino) == data);
    auto reader = open_file(d, ino, O_RDONLY);
    CHECK(reader->fi.direct_io == 0);

    SECTION("a write after the close makes a later reader bypass the pages again") {
        auto again = d.req();
        d.fs->write(again.get(), ino, "x", 1, 0, &writer);
        auto later = open_file(d, ino, O_RDONLY);
        CHECK(later->fi.direct_io == 1);
        auto later_closed = d.req();
        d.fs->release(later_closed.get(), ino, &later->fi);
    }
    auto reader_closed = d.req();
    d.fs->release(reader_closed.get(), ino, &reader->fi);
    auto released = d.req();
    d.fs->release(released.get(), ino, &writer);
}

TEST_CASE("a rewrite waits for readers still following a shared version that ended",
          "[fsd][direct]") {
    // A reader that opens while a shared version is at work (a file created without
    // O_TRUNC, as O_EXCL creates are) reads its writers' pages. When that version has
    // ended and another process rewrites the file, the rewriter's pages would be read
    // as the follower's, cut at its own version's size (the soak caught one): the
    // rewrite waits for such readers as for any page-cache reader.
    Direct d;
    const OtherProcess other;  // a process of its own for the reader (process_of)

    auto made = d.req();
    fuse_file_info created{};
    created.flags = O_WRONLY | O_CREAT | O_EXCL;  // no O_TRUNC: a shared version
    d.fs->create(made.get(), kcache::core::kRootIno, ".tmp.kernel", S_IFREG | 0644, &created);
    REQUIRE(made->err == 0);
    const Ino ino = made->entry.ino;
    const std::string first(1220, 'a');
    auto written = d.req();
    d.fs->write(written.get(), ino, first.data(), first.size(), 0, &made->fi);
    REQUIRE(written->err == 0);

    auto follower = open_file(d, ino, O_RDONLY, other.pid);
    REQUIRE(follower->fi.keep_cache == 1);  // it reads the shared version's pages
    auto closed = d.req();
    d.fs->release(closed.get(), ino, &made->fi);  // the shared version ends, published

    auto rewriter = d.req();
    fuse_file_info rw{};
    rw.flags = O_WRONLY | O_TRUNC;
    d.fs->open(rewriter.get(), ino, &rw);
    CHECK_FALSE(replied_within(*rewriter, 0.3));  // held while the follower reads
    auto follower_closed = d.req();
    d.fs->release(follower_closed.get(), ino, &follower->fi);
    REQUIRE(replied_within(*rewriter, 10));
    REQUIRE(rewriter->err == 0);
    auto rewrite_closed = d.req();
    d.fs->release(rewrite_closed.get(), ino, &rewriter->fi);
}

TEST_CASE("every writer's open waits for other processes' page-cache readers", "[fsd][direct]") {
    // An O_TRUNC open sets the kernel's one size of the inode to 0 when it completes,
    // and a writer's writes grow it: a reader of the old version reading through the
    // page cache meanwhile stops short (the 8-writer publish test saw 64 KiB of a
    // 96 KiB file). An OPEN of a file removed since the kernel looked it up (an
    // orphan) and a CREATE of a file that exists are writers' opens too.
    Direct d;
    const OtherProcess other;  // a process of its own for the reader (process_of)

    const std::string version(3 * 4096 + 100, 'v');
    const Ino ino = d.store_file("kernel.cubin", version);

    auto reader = open_file(d, ino, O_RDONLY, other.pid);
    REQUIRE(reader->fi.direct_io == 0);  // it reads through the page cache

    auto writer = d.req();
    fuse_file_info wfi{};
    wfi.flags = O_WRONLY | O_CREAT | O_TRUNC;
    SECTION("an OPEN of an orphan") {
        auto removed = d.req();
        d.fs->unlink(removed.get(), kcache::core::kRootIno, "kernel.cubin");
        REQUIRE(removed->err == 0);
        wfi.flags = O_WRONLY | O_TRUNC;
        d.fs->open(writer.get(), ino, &wfi);
    }
    SECTION("a CREATE of an existing file") {
        d.fs->create(writer.get(), kcache::core::kRootIno, "kernel.cubin", S_IFREG | 0644, &wfi);
    }
    CHECK_FALSE(replied_within(*writer, 0.3));  // held while the reader reads
    auto reader_closed = d.req();
    d.fs->release(reader_closed.get(), ino, &reader->fi);
    REQUIRE(replied_within(*writer, 10));
    REQUIRE(writer->err == 0);
    auto writer_closed = d.req();
    d.fs->release(writer_closed.get(), ino, &writer->fi);
}

TEST_CASE("a truncate by path is the size told while a reader of the old version is open",
          "[fsd][direct]") {
    // A reader's RELEASE is sent after close() returns: a truncate and a stat by path
    // may come before it (over io_uring they often do). getattr tells the size of the
    // version read through the page cache while it has readers; a truncate by path
    // changes the file in place for everybody, as on a local disk, so from then on the
    // size told is the truncated one.
    Direct d;
    const std::string version(4000, 'v');
    const Ino ino = d.store_file("data.bin", version);

    auto reader = open_file(d, ino, O_RDONLY);
    REQUIRE(reader->fi.direct_io == 0);

    auto truncated = d.req();
    struct stat to {};
    to.st_size = 9000;
    d.fs->setattr(truncated.get(), ino, &to, FUSE_SET_ATTR_SIZE, nullptr);
    REQUIRE(truncated->err == 0);
    CHECK(truncated->attr.st_size == 9000);
    auto stat_by_path = d.req();
    d.fs->getattr(stat_by_path.get(), ino, nullptr);
    REQUIRE(stat_by_path->err == 0);
    CHECK(stat_by_path->attr.st_size == 9000);

    auto reader_closed = d.req();
    d.fs->release(reader_closed.get(), ino, &reader->fi);
    auto after = d.req();
    d.fs->getattr(after.get(), ino, nullptr);
    CHECK(after->attr.st_size == 9000);
}

TEST_CASE("a reader opening a file a rename replaced after its lookup counts its hit once",
          "[fsd][direct]") {
    // CuTe DSL's cache (and Helion's): processes racing on one kernel each write it in
    // a temp dir and os.replace it into place, while others look the file up and open
    // it. The kernel's OPEN can name the inode the lookup found after a racing rename
    // replaced it: the reader still loads the kernel from the cache, so it counts one
    // hit, as if it had opened the file that replaced it.
    Direct d;
    const char* name =
        "cute_dsl_281faa14c93f3f220915b25117724304099157470895ebdf462120ff6f68c266.mlir";
    OtherProcess compiler, reader;  // siblings: neither one's compile is the other's
    const Ino first = d.store_file(name, "module v1", compiler.pid);
    auto looked = d.req();
    d.fs->lookup(looked.get(), kcache::core::kRootIno, name);  // the kernel holds the inode
    REQUIRE(looked->err == 0);
    REQUIRE(looked->entry.ino == first);
    // A racing compile of the same kernel replaces the file (a racing store: no miss).
    d.store_file("cute_dsl_281f.mlir.tmp", "module v1");
    auto renamed = d.req();
    d.fs->rename(renamed.get(), kcache::core::kRootIno, "cute_dsl_281f.mlir.tmp",
                 kcache::core::kRootIno, name, 0);
    REQUIRE(renamed->err == 0);
    auto opened = open_file(d, first, O_RDONLY, reader.pid);  // the inode its lookup found
    auto closed = d.req();
    d.fs->release(closed.get(), first, &opened->fi);
    auto hits = [&] {
        auto txn = d.store->read();
        REQUIRE(txn);
        return txn->counter(kcache::core::Counter::hits).value();
    };
    // The background thread adds the hits to the db every few periods.
    for (int i = 0; i < 500 && hits() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(hits() == 1);
    // The same process opening the file that replaced it is the same hit: not counted again.
    auto again = d.req();
    d.fs->lookup(again.get(), kcache::core::kRootIno, name);
    REQUIRE(again->err == 0);
    REQUIRE(again->entry.ino != first);
    auto reopened = open_file(d, again->entry.ino, O_RDONLY, reader.pid);
    auto closed_again = d.req();
    d.fs->release(closed_again.get(), again->entry.ino, &reopened->fi);
    d.fs->stop();  // flushes the statistics
    auto txn = d.store->read();
    REQUIRE(txn);
    CHECK(txn->counter(kcache::core::Counter::misses).value() == 1);
    CHECK(txn->counter(kcache::core::Counter::hits).value() == 1);
}
