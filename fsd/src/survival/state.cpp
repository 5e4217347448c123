#include "state.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "handles.hpp"

namespace kcache::fsd {

core::Result<std::unique_ptr<StateFile>> StateFile::map(int fd) {
    static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                  "hit pairs are shared by processes: their atomics must be lock-free");
    std::unique_ptr<StateFile> state(new StateFile);
    // A keeper of an older build made the memfd without the hit pairs: grow it (a
    // daemon may: the keeper only holds the memfd, it maps nothing).
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) < kSize &&
        ::ftruncate(fd, static_cast<off_t>(kSize)) != 0) {
        return core::fail(errno, fmt::format("cannot grow the daemon's state to {} bytes: {}",
                                             kSize, std::strerror(errno)));
    }
    const int flags = fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    state->m_base = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (state->m_base == MAP_FAILED) {
        state->m_base = nullptr;
        return core::fail(errno,
                          fmt::format("cannot map the daemon's state: {}", std::strerror(errno)));
    }
    state->m_header = static_cast<StateHeader*>(state->m_base);
    state->m_records =
        reinterpret_cast<HandleRecord*>(static_cast<char*>(state->m_base) + sizeof(StateHeader));
    state->m_hit_pairs = reinterpret_cast<std::atomic<std::uint64_t>*>(
        static_cast<char*>(state->m_base) + kRecordsEnd);
    StateHeader& h = *state->m_header;
    if (h.magic == kStateMagic) {
        if (h.layout != kLayout || h.slots != kHandleSlots) {
            return core::fail(EINVAL, fmt::format("the state left by the previous daemon has "
                                                  "layout {} ({} slots); this one reads {} ({})",
                                                  h.layout, h.slots, kLayout, kHandleSlots));
        }
        state->m_inherited = true;
    } else {
        h.layout = kLayout;
        h.slots = kHandleSlots;
        h.magic = kStateMagic;
    }
    h.daemons.fetch_add(1);
    return state;
}

StateFile::~StateFile() {
    if (m_base) ::munmap(m_base, kSize);
}

namespace {

std::uint32_t slot_of(std::uint64_t fh) {
    return static_cast<std::uint32_t>(fh & 0xffffffffu) - 1;
}
std::uint32_t generation_of(std::uint64_t fh) {
    return static_cast<std::uint32_t>(fh >> 32);
}

}  // namespace

HandleTable::HandleTable(StateFile& state)
    : m_state(state), m_live(new std::atomic<void*>[kHandleSlots]) {
    HandleRecord* records = m_state.records();
    m_free.reserve(kHandleSlots);
    for (std::uint32_t s = kHandleSlots; s-- > 0;) {
        m_live[s].store(nullptr, std::memory_order_relaxed);
        if (m_state.inherited() &&
            records[s].kind.load(std::memory_order_acquire) != HandleKind::free) {
            ++m_inherited;
            continue;
        }
        m_free.push_back(s);
    }
}

HandleTable::~HandleTable() = default;  // the handles still open end with the process

void HandleTable::on_rebuild(RebuildFile file, RebuildDir dir) {
    m_rebuild_file = std::move(file);
    m_rebuild_dir = std::move(dir);
}

std::optional<HandleTable::TakenSlot> HandleTable::take_slot() {
    std::uint32_t slot = 0;
    {
        MutexLock lock(m_mutex);
        if (m_free.empty()) return std::nullopt;
        slot = m_free.back();
        m_free.pop_back();
    }
    HandleRecord& r = m_state.records()[slot];
    std::uint32_t generation = r.generation.load(std::memory_order_relaxed) + 1;
    if (generation == 0) generation = 1;
    r.generation.store(generation, std::memory_order_relaxed);
    return TakenSlot{slot, (std::uint64_t{generation} << 32) | (slot + 1)};
}

std::uint64_t HandleTable::add_file(FileHandle* handle, const HandleRecord& fields) {
    const auto taken = take_slot();
    if (!taken) return 0;
    HandleRecord& r = m_state.records()[taken->slot];
    r.readable = fields.readable;
    r.writable = fields.writable;
    r.unpublished.store(fields.unpublished.load(), std::memory_order_relaxed);
    if (fields.unpublished.load()) ++m_unpublished;
    r.opener = fields.opener;
    r.version = fields.version;
    r.ino = fields.ino;
    r.size = fields.size;
    r.digest = fields.digest;
    handle->fh = taken->fh;
    m_live[taken->slot].store(handle, std::memory_order_release);
    r.kind.store(HandleKind::file, std::memory_order_release);
    return taken->fh;
}

std::uint64_t HandleTable::add_dir(DirHandle* handle, core::Ino ino) {
    const auto taken = take_slot();
    if (!taken) return 0;
    HandleRecord& r = m_state.records()[taken->slot];
    r.readable = 1;
    r.writable = 0;
    r.unpublished.store(0, std::memory_order_relaxed);
    r.version = 0;
    r.ino = ino;
    m_live[taken->slot].store(handle, std::memory_order_release);
    r.kind.store(HandleKind::dir, std::memory_order_release);
    return taken->fh;
}

HandleRecord* HandleTable::record_of(std::uint64_t fh, HandleKind kind) {
    if (fh == 0) return nullptr;
    const std::uint32_t slot = slot_of(fh);
    if (slot >= kHandleSlots) return nullptr;
    HandleRecord& r = m_state.records()[slot];
    if (r.kind.load(std::memory_order_acquire) != kind) return nullptr;
    if (r.generation.load(std::memory_order_relaxed) != generation_of(fh)) return nullptr;
    return &r;
}

void* HandleTable::live_or_rebuild(std::uint64_t fh, HandleKind kind) {
    HandleRecord* r = record_of(fh, kind);
    if (!r) return nullptr;
    const std::uint32_t slot = slot_of(fh);
    if (void* p = m_live[slot].load(std::memory_order_acquire)) return p;
    // A slot a predecessor left: rebuilt once, by whichever request comes first.
    MutexLock lock(m_rebuild_mutex);
    if (void* p = m_live[slot].load(std::memory_order_acquire)) return p;
    void* made = nullptr;
    if (kind == HandleKind::file && m_rebuild_file) {
        FileHandle* h = m_rebuild_file(*r);
        if (h) h->fh = fh;
        // A writer that kept its unpublished bytes (spill.hpp) counts as this daemon's.
        if (h && !h->lost && r->unpublished.load()) ++m_unpublished;
        made = h;
    } else if (kind == HandleKind::dir && m_rebuild_dir) {
        made = m_rebuild_dir(*r);
    }
    m_live[slot].store(made, std::memory_order_release);
    return made;
}

FileHandle* HandleTable::file(std::uint64_t fh) {
    return static_cast<FileHandle*>(live_or_rebuild(fh, HandleKind::file));
}

DirHandle* HandleTable::dir(std::uint64_t fh) {
    return static_cast<DirHandle*>(live_or_rebuild(fh, HandleKind::dir));
}

void HandleTable::release(std::uint64_t fh, bool counted) {
    const std::uint32_t slot = slot_of(fh);
    if (m_state.records()[slot].unpublished.exchange(0) && counted) --m_unpublished;
    m_live[slot].store(nullptr, std::memory_order_relaxed);
    m_state.records()[slot].kind.store(HandleKind::free, std::memory_order_release);
    MutexLock lock(m_mutex);
    m_free.push_back(slot);
}

std::unique_ptr<FileHandle> HandleTable::take_file(std::uint64_t fh) {
    if (!record_of(fh, HandleKind::file)) return nullptr;
    std::unique_ptr<FileHandle> handle(file(fh));
    release(fh, handle && !handle->lost);  // a lost writer's flag was never counted here
    return handle;
}

std::unique_ptr<DirHandle> HandleTable::take_dir(std::uint64_t fh) {
    if (!record_of(fh, HandleKind::dir)) return nullptr;
    std::unique_ptr<DirHandle> handle(static_cast<DirHandle*>(m_live[slot_of(fh)].load()));
    release(fh, false);
    return handle;
}

void HandleTable::set_unpublished(std::uint64_t fh, bool unpublished) {
    HandleRecord* r = record_of(fh, HandleKind::file);
    if (!r) return;
    const std::uint8_t was = r->unpublished.exchange(unpublished ? 1 : 0);
    if (was != (unpublished ? 1 : 0)) m_unpublished += unpublished ? 1 : -1;
}

void HandleTable::rebuild_inherited(const std::function<bool(const HandleRecord&)>& now) {
    if (!m_inherited) return;
    HandleRecord* records = m_state.records();
    for (std::uint32_t s = 0; s < kHandleSlots; ++s) {
        HandleRecord& r = records[s];
        if (r.kind.load(std::memory_order_acquire) != HandleKind::file || !now(r)) continue;
        (void)file((std::uint64_t{r.generation.load()} << 32) | (s + 1));
    }
}

}  // namespace kcache::fsd
