#include "serve.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "db_damage.hpp"
#include "filesystem.hpp"
#include "kcache/core/holds.hpp"
#include "kcache/core/integrity.hpp"
#include "kcache/core/store.hpp"
#include "log.hpp"
#include "resend.hpp"
#include "state.hpp"
#include "takeover.hpp"
#include "uring_area.hpp"
#include "uring_transport.hpp"

namespace kcache::fsd {
using core::fail;
using core::Status;

std::vector<std::string> fuse_arguments(const Options& options) {
    std::vector<std::string> args{"kcache-fsd", "-o",
                                  "fsname=kcache:" + options.db + ",subtype=kcache"};
    for (const auto& o : options.fuse_options) {
        args.push_back("-o");
        args.push_back(o);
    }
    if (options.debug) args.push_back("-d");
    return args;
}

namespace {

using OpenedStore = kcache::core::Result<std::unique_ptr<kcache::core::Store>>;

// A damaged db (`store` failed with kCorruptDb) set aside and a fresh one opened in its
// place, starting its inode numbers above the old one's. Returns where the damaged db went.
std::string set_damaged_aside(const Options& options, const kcache::core::OpenOptions& open,
                              OpenedStore& store, StartupPipe& startup) {
    const std::string why = store.error().message;
    auto aside = kcache::core::set_aside(options.db, kcache::core::system_clock_ns());
    if (!aside)
        startup.fail_startup(fmt::format("db {} is damaged ({}) and cannot be set aside: {}",
                                         options.db, why, aside.error().message));
    const std::string set_aside = *aside;
    std::remove((options.db + "/" + kCorruptMarker).c_str());
    log::error(
        "DB DAMAGED: {} ({}); set aside as {} for `kcache verify --db` and a "
        "person; serving a fresh db",
        options.db, why, set_aside);
    store = kcache::core::Store::open(open);
    if (store) {
        // The kernel may still know the old db's inode numbers (a takeover): the
        // fresh one starts far above them (seconds << 24: later set-asides higher).
        const auto floor = static_cast<std::uint64_t>(kcache::core::system_clock_ns() / 1000000000)
                           << 24;
        auto marked = (*store)->update([&](kcache::core::WriteTxn& txn) -> Status {
            KCACHE_TRY(kcache::core::start_inodes_at(txn, floor));
            return txn.add(kcache::core::Counter::damaged_dbs, 1);
        });
        if (!marked) startup.fail_startup(marked.error().message);
    }
    return set_aside;
}

// Limits given on the command line become the db's (the CLI sees the same ones).
void apply_limits(kcache::core::Store& store, const Options& options, StartupPipe& startup) {
    auto configured = store.update([&](kcache::core::WriteTxn& txn) -> Status {
        kcache::core::Config config = txn.config();
        if (options.max_bytes) config.max_bytes = options.max_bytes;
        if (options.max_entries) config.max_entries = options.max_entries;
        if (options.entry_depth) config.entry_depth = options.entry_depth;
        if (options.layout_rules) config.layout_rules = *options.layout_rules;
        return txn.set_config(config);
    });
    if (!configured) startup.fail_startup(configured.error().message);
}

// Opens the db this daemon serves, after the start-up check, with the db's lock taken
// (read-write) and the command line's limits applied. `set_aside`: where a damaged db
// went, if one was.
std::unique_ptr<kcache::core::Store> open_db(const Options& options, const std::string& mountpoint,
                                             StartupPipe& startup,
                                             const std::optional<keeper::Inherited>& inherited,
                                             std::string& set_aside) {
    kcache::core::OpenOptions open;
    open.path = options.db;
    open.create = !options.read_only;
    open.read_only = options.read_only;
    open.durability = options.durability;
    if (options.entry_depth) open.entry_depth = options.entry_depth;
    // The start-up check (docs/operations.md, "A damaged db"): the whole walk when this
    // daemon mounts, only the marker of a predecessor that found damage when it takes a
    // mount over (a kill -9's successor must start at once). A damaged db is set aside
    // and a fresh one served: a cache is rebuilt by its compilers, a node that cannot
    // compile is not. Read-only serving changes nothing: it refuses to start instead.
    // A daemon a keeper starts on a mount another daemon served has the db's lock already.
    const bool taking_over = inherited && inherited->lock_fd >= 0;
    std::optional<std::string> damage = db_damage(options.db, !taking_over, options.read_only);
    // From here a fault leaves a marker (install_crash_marker): one before "ready" makes
    // the successor set the db aside (kStartupCrash), one later makes it check deeply.
    if (!damage && !options.read_only) install_crash_marker(options.db);
    auto store = damage ? OpenedStore(fail(kcache::core::kCorruptDb, *damage))
                        : kcache::core::Store::open(open);
    // One daemon per db (lock_db_for_daemon), taken before a set-aside or the first change.
    std::optional<int> lock_fd;
    auto take_lock = [&] {
        if (lock_fd) return;
        auto lock = lock_db_for_daemon(options.db, mountpoint, inherited ? inherited->lock_fd : -1);
        if (!lock) startup.fail_startup(lock.error().message);
        lock_fd = *lock;
    };
    // Only a db known to be a kcache db is set aside: one the check found damaged (it
    // opens only where kcache.lock is), or the one a predecessor served. A data.mdb of
    // garbage in a directory kcache never used is refused (exit 1), as before.
    if (!store && store.error().code == kcache::core::kCorruptDb && !options.read_only &&
        (damage || taking_over)) {
        take_lock();  // a daemon serving it would keep this one out: nothing is moved then
        set_aside = set_damaged_aside(options, open, store, startup);
    }
    if (damage && store && !options.read_only) install_crash_marker(options.db);  // the fresh db
    if (!store && store.error().code == EROFS) {
        startup.fail_startup(store.error().message +
                             " (serve it read-only with --read-only or -o ro)");
    }
    if (!store) startup.fail_startup(store.error().message);
    // A read-only daemon changes nothing (no statistics, no eviction): several may
    // serve one db, beside a read-write one, and its filesystem may be read-only.
    if (!options.read_only) {
        take_lock();
        if (inherited && inherited->lock_fd < 0) startup.pass_fd(*lock_fd);
        apply_limits(**store, options, startup);
    }
    return std::move(*store);
}

// The FUSE session on the mount: mounted here, or the keeper's /dev/fuse (libfuse takes
// "/dev/fd/N" as an open connection, and leaves the unmount to the keeper).
fuse_session* open_session(fuse_args& args, Filesystem& filesystem, const std::string& mountpoint,
                           const std::optional<keeper::Inherited>& inherited,
                           StartupPipe& startup) {
    fuse_session* session =
        fuse_session_new(&args, &Filesystem::operations(), sizeof(fuse_lowlevel_ops), &filesystem);
    if (!session) startup.fail_startup("invalid FUSE options (see above)");
    if (fuse_set_signal_handlers(session) != 0)
        startup.fail_startup("cannot install signal handlers");
    const std::string device =
        inherited ? fmt::format("/dev/fd/{}", inherited->fuse_fd) : mountpoint;
    if (fuse_session_mount(session, device.c_str()) != 0) {
        startup.fail_startup(fmt::format(
            "cannot mount {} (is /dev/fuse usable and fusermount3 installed?)", mountpoint));
    }
    return session;
}

// A fresh mount: the kernel knows no open file, so no hold a dead mount's daemons took
// for one (core/holds.hpp) can be used again. A takeover keeps them.
void clear_previous_holds(kcache::core::Store& store) {
    auto cleared = [&]() -> kcache::core::Result<std::uint64_t> {
        auto txn = KCACHE_TRY(store.write());
        const std::uint64_t n = KCACHE_TRY(kcache::core::clear_holds(txn));
        KCACHE_TRY(txn.commit());
        return n;
    }();
    if (!cleared)
        log::warning("cannot clear the holds of a previous mount: {}", cleared.error().message);
    else if (*cleared)
        log::info("cleared {} holds on blobs for files a previous mount had open", *cleared);
}

void log_serving(const Options& options, const std::string& mountpoint, bool resuming,
                 std::size_t adopted, const std::string& set_aside) {
    if (resuming) {
        log::info("took over {} at {} (daemon {}; {} open handles left by the previous one)",
                  options.db, mountpoint, getpid(), adopted);
    } else {
        log::info("serving {} at {}{}", options.db, mountpoint,
                  options.read_only ? " read-only" : "");
    }
    if (!set_aside.empty())
        log::error("DB DAMAGED: serving a fresh db; the damaged one is kept at {}", set_aside);
    if (options.remote && !resuming) {
        std::string servers;
        for (const auto& e : options.remote->servers)
            servers += (servers.empty() ? "" : ", ") + e.id();
        log::info("shared tier: {} (namespace {}{})", servers, options.remote->ns,
                  options.remote->read_only ? ", read-only" : "");
    }
}

// The upgrade watcher's thread: on SIGUSR2 (`signals`) the daemon stops at a request
// boundary once no writer has unpublished bytes (Filesystem::try_hand_over), and ends the
// loop with `handed_over` set.
void watch_for_upgrade(Filesystem& filesystem, fuse_session* session, const sigset_t& signals,
                       const std::atomic<bool>& loop_done, std::atomic<bool>& handed_over) {
    const timespec tick{0, 100 * 1000 * 1000};
    while (!loop_done) {
        siginfo_t info{};
        if (sigtimedwait(&signals, &info, &tick) != SIGUSR2) continue;
        log::info("upgrade: handing the mount over at a request boundary");
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        bool ready = false;
        while (!loop_done && !(ready = filesystem.try_hand_over()) &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (!ready) {
            log::warning(
                "upgrade postponed: writers kept bytes unpublished for 30 s (SIGHUP to "
                "the keeper tries again)");
            continue;
        }
        handed_over = true;
        fuse_session_exit(session);
        kill(getpid(), SIGTERM);  // wakes the loop: libfuse's handler ends it
        return;
    }
}

// libfuse's workers serve the session until it ends; returns the loop's result.
int run_loop(fuse_session* session) {
    fuse_loop_config* loop = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(loop, 0);
    fuse_loop_cfg_set_max_threads(loop, 16);
    const int rc = fuse_session_loop_mt(session, loop);
    fuse_loop_cfg_destroy(loop);
    return rc;
}

// The session's transport, with its takeover and resend: --io-uring's rings are set up
// when the kernel's INIT comes (uring_transport.hpp); /dev/fuse serves until then, and
// alone where the kernel does not offer them (null).
std::unique_ptr<UringTransport> install_transport(
    Takeover& takeover, const Resend& resend, fuse_session* session, const Options& options,
    const std::string& mountpoint, const std::optional<keeper::Inherited>& inherited) {
    std::unique_ptr<UringTransport> uring;
    if (options.io_uring) {
        uring = UringTransport::install(session, takeover, resend,
                                        inherited ? inherited->state_fd : -1, mountpoint);
    }
    if (!uring) takeover.install_plain(session);
    return uring;
}

// The shared tier (--remote), made after the fork (its threads must not cross it). It
// connects lazily: an unreachable Redis does not stop start-up, it only costs misses.
std::unique_ptr<RemoteTier> make_remote(kcache::core::Store& store, const Options& options,
                                        Filesystem& filesystem, StartupPipe& startup) {
    std::unique_ptr<RemoteTier> remote;
    if (options.remote) {
        auto made =
            RemoteTier::create(store, *options.remote, options.prefetch_job_tag, options.job_tag);
        if (!made) startup.fail_startup(made.error().message);
        remote = std::move(*made);
        filesystem.attach_remote(remote.get());
    }
    return remote;
}

// After the loop: every thread that could handle or answer a request stopped, in order,
// then the session closed.
void shut_down(fuse_session* session, fuse_args& args, std::unique_ptr<UringTransport>& uring,
               RemoteTier* remote, Filesystem& filesystem) {
    if (uring) uring->stop();       // no handler runs after this; later replies are refused
    if (remote) remote->stop();     // waiting lookups answered, counts recorded
    filesystem.stop();              // statistics flushed, db synced; no notification after this
    uring.reset();                  // no reply can come any more
    fuse_session_unmount(session);  // the keeper's mount: left to the keeper
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    fuse_opt_free_args(&args);
}

// The exit status of a daemon whose loop returned `rc`, logged.
int stopped(int rc, bool handed_over, const std::string& mountpoint,
            const std::optional<keeper::Inherited>& inherited) {
    // A loop ended by SIGTERM/SIGINT/SIGHUP returns the signal: a clean stop too.
    const bool clean = rc == 0 || rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
    if (handed_over) {
        log::info("daemon {} handed the mount over", getpid());
        return keeper::kHandedOver;
    }
    if (clean && !inherited)
        log::info("unmounted {}", mountpoint);
    else if (clean)
        log::info("daemon {} stopped", getpid());
    else
        log::error("the FUSE loop failed ({}){}", rc,
                   inherited ? "" : fmt::format("; unmounted {}", mountpoint));
    return clean ? 0 : 1;
}

}  // namespace

int serve(const Options& options, const std::string& mountpoint, StartupPipe& startup,
          const std::optional<keeper::Inherited>& inherited) {
    // SIGTERM, SIGINT and SIGHUP end the FUSE loop only where they interrupt the thread
    // that waits for it (libfuse's handler sets a flag, then that thread must wake): a
    // thread of ours that took one (the background thread, the shared tier's...) left
    // the daemon serving. So every thread started from here on blocks them, and this
    // one takes them again just before the loop (libfuse's workers block them too).
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // A predecessor's ring entries are mapped where it had them before anything else
    // takes the address (uring_area.hpp): the db's map, threads' stacks.
    if (inherited && options.io_uring) uring_area::reserve_inherited(inherited->state_fd);

    std::string set_aside;  // where the damaged db went
    const std::unique_ptr<kcache::core::Store> store =
        open_db(options, mountpoint, startup, inherited, set_aside);

    // SIGUSR2 (from the keeper: an upgrade) is taken by the hand-over thread below; every
    // thread made from here on inherits the mask.
    sigset_t handover_signals;
    sigemptyset(&handover_signals);
    sigaddset(&handover_signals, SIGUSR2);
    if (inherited) pthread_sigmask(SIG_BLOCK, &handover_signals, nullptr);

    // The handle table and the saved INIT: the keeper's memfd, or private memory.
    auto state = StateFile::map(inherited ? inherited->state_fd : -1);
    if (!state) startup.fail_startup(state.error().message);
    // Resent requests answered once (resend.hpp): the handlers' and the transport's.
    const Resend resend(state->get());
    Filesystem filesystem(*store, options, state->get(), &resend);
    // Kept after "ready": an upgrade reports "handed over" on it (keeper.hpp).
    const int report_fd = inherited ? fcntl(inherited->ready_fd, F_DUPFD_CLOEXEC, 0) : -1;
    const std::unique_ptr<RemoteTier> remote = make_remote(*store, options, filesystem, startup);
    std::vector<std::string> arg_storage = fuse_arguments(options);
    std::vector<char*> fuse_argv;
    for (auto& a : arg_storage) fuse_argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
    fuse_session* session = open_session(args, filesystem, mountpoint, inherited, startup);
    const bool resuming = (*state)->inherited();
    const std::size_t adopted = resuming ? filesystem.adopt_handles() : 0;
    if (!resuming && !options.read_only) clear_previous_holds(*store);
    serving_started();  // the db is open and read: a fault from here on is no start-up's
    // The session's takeover (takeover.hpp): outlives its transport and the session.
    Takeover takeover(**state, fuse_session_fd(session), resend);
    std::unique_ptr<UringTransport> uring =
        install_transport(takeover, resend, session, options, mountpoint, inherited);
    if (remote) remote->start();
    filesystem.start(session);
    startup.ready(options.db + "/fsd.log");
    log_serving(options, mountpoint, resuming, adopted, set_aside);

    // An upgrade (keeper.hpp): on SIGUSR2 the daemon stops at a request boundary once no
    // writer has unpublished bytes (Filesystem::try_hand_over), and exits kHandedOver;
    // what it had read and not answered is resent to its successor.
    std::atomic<bool> loop_done{false};
    std::atomic<bool> handed_over{false};
    std::thread handover;
    if (inherited) {
        handover = std::thread([&] {
            watch_for_upgrade(filesystem, session, handover_signals, loop_done, handed_over);
        });
    }

    // One pending since start-up is taken here: the loop then ends at once.
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    const int rc = run_loop(session);
    loop_done = true;
    if (handover.joinable()) handover.join();
    // Handed over: the successor may start now. Its resend brings back what this daemon
    // read and left unanswered; what the clean-up below waits on may need it. The ring
    // threads end first, with no entry waiting in the kernel (hand_over): the successor
    // answers what their entries hold then, and only once nobody else can
    // (uring_area.hpp).
    if (handed_over && uring) uring->hand_over();
    if (handed_over) (void)!::send(report_fd, "handed over", 11, MSG_NOSIGNAL);

    shut_down(session, args, uring, remote.get(), filesystem);
    return stopped(rc, handed_over, mountpoint, inherited);
}

}  // namespace kcache::fsd
