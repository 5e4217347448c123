#include "uring_area.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "log.hpp"
#include "state.hpp"

namespace kcache::fsd::uring_area {

namespace {

constexpr std::size_t kPage = 4096;

static_assert(static_cast<std::size_t>(kOffset) >= StateFile::kSize,
              "the ring area must start after the state's records and hit pairs");

struct Header {
    std::atomic<std::uint64_t> magic;  // stored last
    std::uint64_t address;             // where the daemon that made it mapped it
    std::uint64_t size;                // bytes from kOffset
    Geometry geometry;
};

std::size_t records_bytes(const Geometry& g) {
    const std::size_t bytes = std::size_t{g.rings} * g.per_ring * sizeof(SlotRecord);
    return (bytes + kPage - 1) / kPage * kPage;
}
std::uint64_t size_of(const Geometry& g) {
    return kPage + records_bytes(g) + std::uint64_t{g.rings} * g.per_ring * g.entry_size;
}

// The process's area (one session per process); set before the ring threads start.
struct Area {
    char* base = nullptr;
    std::uint64_t size = 0;
    Geometry geometry;
    bool inherited = false;
};
Area g_reserved;  // the predecessor's, mapped by reserve_inherited
Area g_area;      // the one in use, from create

}  // namespace

void reserve_inherited(int state_fd) {
    Header h{};
    if (state_fd < 0 || ::pread(state_fd, &h, sizeof h, kOffset) != sizeof h ||
        h.magic.load() != kMagic) {
        return;
    }
    const Geometry& g = h.geometry;
    if (g.rings == 0 || g.per_ring == 0 || g.entry_size % kPage != 0 || h.size != size_of(g) ||
        h.size > kMaxSize) {
        log::warning(
            "io_uring: the ring area left by the previous daemon is not one (size {}): "
            "what its ring entries held is not answered",
            h.size);
        return;
    }
    void* want = reinterpret_cast<void*>(h.address);
    void* got = ::mmap(want, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                       state_fd, kOffset);
    if (got != want) {
        const int err = got == MAP_FAILED ? errno : EEXIST;
        if (got != MAP_FAILED) ::munmap(got, h.size);
        log::error(
            "io_uring: cannot map the previous daemon's ring entries at {} ({}): the requests "
            "they held wait until the mount ends",
            want, std::strerror(err));
        return;
    }
    g_reserved = {static_cast<char*>(got), h.size, g, true};
}

core::Status create(int state_fd, const Geometry& g) {
    if (g_reserved.base && g_reserved.geometry == g) {
        g_area = g_reserved;
        g_reserved = {};
        return {};
    }
    if (g_reserved.base) {
        log::warning(
            "io_uring: the previous daemon's rings had another shape ({} x {} entries of {} "
            "bytes; now {} x {} of {}): the requests its entries held wait until the mount ends",
            g_reserved.geometry.rings, g_reserved.geometry.per_ring, g_reserved.geometry.entry_size,
            g.rings, g.per_ring, g.entry_size);
        ::munmap(g_reserved.base, g_reserved.size);
        g_reserved = {};
    }
    const std::uint64_t size = size_of(g);
    void* base = MAP_FAILED;
    struct stat st {};
    if (state_fd >= 0 && ::fstat(state_fd, &st) == 0) {
        const off_t end = kOffset + static_cast<off_t>(size);
        // A fresh area: whatever an area of another shape left here reads as zeros.
        if (st.st_size > kOffset)
            (void)::fallocate(state_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kOffset,
                              st.st_size - kOffset);
        if (st.st_size >= end || ::ftruncate(state_fd, end) == 0)
            base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, state_fd, kOffset);
        if (base == MAP_FAILED)
            log::warning(
                "io_uring: cannot keep the ring entries in the state memfd ({}): a successor "
                "cannot answer what they hold when this daemon dies",
                std::strerror(errno));
    }
    if (base == MAP_FAILED) {
        base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED)
            return core::fail(errno, fmt::format("cannot map {} bytes of ring entries: {}", size,
                                                 std::strerror(errno)));
    }
    auto* h = new (base) Header{};
    h->address = reinterpret_cast<std::uint64_t>(base);
    h->size = size;
    h->geometry = g;
    h->magic.store(kMagic, std::memory_order_release);
    g_area = {static_cast<char*>(base), size, g, false};
    return {};
}

bool inherited() {
    return g_area.inherited;
}

SlotRecord& record(std::uint32_t ring, std::uint32_t slot) {
    auto* records = reinterpret_cast<SlotRecord*>(g_area.base + kPage);
    return records[std::size_t{ring} * g_area.geometry.per_ring + slot];
}

char* entry(std::uint32_t ring, std::uint32_t slot) {
    const std::size_t index = std::size_t{ring} * g_area.geometry.per_ring + slot;
    return g_area.base + kPage + records_bytes(g_area.geometry) +
           index * g_area.geometry.entry_size;
}

}  // namespace kcache::fsd::uring_area
