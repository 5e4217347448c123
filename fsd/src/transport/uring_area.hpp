// The memory of kcache-fsd's io_uring ring entries (uring_transport.hpp), kept in the
// keeper's state memfd so that a daemon taking the mount over can finish the requests
// its dead predecessor's entries hold (issue 20, takeover.hpp for /dev/fuse).
//
// Why: the kernel (fs/fuse/dev_uring.c, Linux 6.14-6.18) neither resends a request a
// ring entry holds (FUSE_NOTIFY_RESEND requeues /dev/fuse's lists only) nor ends it
// while the connection lives. What ends it is a COMMIT_AND_FETCH naming its unique, on
// any io_uring of the connection: the kernel finds the request in its queue, takes the
// committing command as the entry's own from then on (the entry is adopted), and copies
// the reply from the entry's buffers, whose addresses the predecessor registered, in the
// committer's address space. So the buffers live here, and a successor maps them at the
// predecessor's address (reserve_inherited, before anything else is mapped), reads what
// each entry holds and answers it (uring_ring.cpp, Ring::adopt).
//
// What an entry held when its daemon died, from its buffer and its SlotRecord (written
// by the daemon around each reply, fill() in uring_transport.cpp):
// - nothing to do: no request yet, or the commit of its last one was processed
//   (`committed`);
// - a reply written and maybe not committed (`replied`): commit it again (the kernel
//   answers ENOENT if it had it);
// - a request not answered: redo it (a resent request, resend.hpp). The reply overwrites
//   the request's fuse_in_header and the head of its payload: before it does, fill()
//   saves what it overwrites (`filling`, `saved`), so a reply cut short by the death
//   leaves the request whole.
// A request the kernel hands to an entry of a ring thread that is ending, and has not
// copied to it yet, is ended with ECANCELED by the kernel (6.18): its caller gets the
// error. An upgrade avoids it: the rings keep what comes and their threads end only
// once no entry waits in the kernel (UringTransport::hand_over), so every request is
// in an entry or still queued for the successor. A kill -9 cannot (seen under load).
// Entries that ended empty are never used by the kernel again: their slots are reused.
//
// Layout at kOffset of the memfd: a Header, the SlotRecords (rings x per_ring), then the
// entries' buffers, each entry_size bytes: a page with the ReqHeader, a page whose start
// holds the saved bytes and whose end the request's headers (uring_ring.hpp), then the
// payload. Without a keeper (or where the memfd cannot grow) the same layout lives in
// private memory and there is nothing to inherit.
//
// Thread safety: set up once, before the ring threads start (create); a slot's buffer
// and record are written by the thread that owns the slot's entry (or, for a deferred
// reply, by the replying thread under the ring's hand-off lock, never once the ring is
// closed), and read by a successor only after its predecessor died (the keeper's
// waitpid orders them) or, at an upgrade, closed its rings and said "handed over".
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kcache/core/error.hpp"

namespace kcache::fsd::uring_area {

// Beyond the state's handle records and hit pairs (state.hpp checks it).
inline constexpr off_t kOffset = off_t{64} << 20;
inline constexpr std::uint64_t kMagic = 0x6b63726e67617265ull;  // "kcrngare"
// An area larger than this is not ours (a corrupt header): 64 GiB of address space.
inline constexpr std::uint64_t kMaxSize = std::uint64_t{64} << 30;

struct SlotRecord {
    std::atomic<std::uint64_t> filling{0};    // unique whose reply is being written
    std::atomic<std::uint64_t> replied{0};    // unique whose reply is in the buffer
    std::atomic<std::uint64_t> committed{0};  // unique whose commit the kernel processed
    std::atomic<std::uint32_t> saved{0};      // bytes of the payload saved before `filling`
    std::uint32_t payload_sz = 0;             // the request's payload_sz, saved with them
};

struct Geometry {
    std::uint32_t rings = 0;
    std::uint32_t per_ring = 0;
    std::uint64_t entry_size = 0;
    std::uint64_t payload_size = 0;
    bool operator==(const Geometry&) const = default;
};

// Early in a daemon that inherits a state (before its db or any thread maps memory):
// maps the area its predecessor left at the predecessor's address. Logs and gives up
// (the successor then cannot answer what the dead entries hold) when that address is
// taken. No-op when the memfd has no area.
void reserve_inherited(int state_fd);

// The area for `g` (at the INIT reply, before the rings are made): the inherited one when
// its geometry is `g` (inherited() is then true), else a new one in the memfd (or in
// private memory when state_fd < 0). Once per process.
core::Status create(int state_fd, const Geometry& g);
bool inherited();
char* entry(std::uint32_t ring, std::uint32_t slot);
SlotRecord& record(std::uint32_t ring, std::uint32_t slot);

}  // namespace kcache::fsd::uring_area
