#include "resend.hpp"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "faults.hpp"
#include "log.hpp"
#include "takeover.hpp"

namespace kcache::fsd::resend {

namespace {

StateFile* g_state = nullptr;
Op g_fault = Op::none;             // KCACHE_FSD_FAULT
bool g_fault_any_outcome = false;  // kill_before_reply: not only after a commit

thread_local std::uint64_t t_unique = 0;
thread_local Op t_recorded = Op::none;  // by the current request

// By Op's value: the fault point's spelling and the log's.
constexpr const char* kOpNames[] = {"none",        "mkdir", "symlink", "create",
                                    "unlink",      "rmdir", "rename",  "setxattr",
                                    "removexattr", "mknod", "link"};
static_assert(std::size(kOpNames) == static_cast<std::size_t>(Op::link) + 1);

Op parse_op(const std::string& name) {
    for (std::size_t i = 1; i < std::size(kOpNames); ++i)
        if (name == kOpNames[i]) return static_cast<Op>(i);
    return Op::none;
}

AnswerRecord& slot_of(std::uint64_t unique) {
    // Uniques grow by 2 per request: those in flight at once do not share a slot.
    return g_state->header().answers[(unique >> 1) % kAnswerSlots];
}

}  // namespace

const char* name_of(Op op) {
    const auto i = static_cast<std::size_t>(op);
    return i < std::size(kOpNames) ? kOpNames[i] : "?";
}

void attach(StateFile& state) {
    g_state = &state;
    const NamedFault named = named_fault();  // faults.hpp's table
    if (named.fault == Fault::kill_after_commit || named.fault == Fault::kill_before_reply) {
        g_fault = parse_op(std::string(named.argument));
        g_fault_any_outcome = named.fault == Fault::kill_before_reply;
    }
    if (named.fault != Fault::none && named.fault != Fault::slow_uploader && g_fault == Op::none)
        log::warning("KCACHE_FSD_FAULT={}: not a fault point (ignored)", fault_point());
}

void set_current(std::uint64_t unique) {
    t_unique = unique;
    t_recorded = Op::none;
}

bool resent() {
    return (t_unique & takeover::kResendBit) != 0;
}

void record(Op op, core::Ino ino) {
    t_recorded = op;
    const std::uint64_t unique = t_unique & ~takeover::kResendBit;
    if (!g_state || unique == 0) return;
    AnswerRecord& a = slot_of(unique);
    a.unique.store(0, std::memory_order_relaxed);
    a.op = static_cast<std::uint8_t>(op);
    a.ino = ino;
    a.unique.store(unique, std::memory_order_release);
}

std::optional<core::Ino> recorded(Op op) {
    if (!g_state || !resent()) return std::nullopt;
    const std::uint64_t unique = t_unique & ~takeover::kResendBit;
    const AnswerRecord& a = slot_of(unique);
    if (a.unique.load(std::memory_order_acquire) != unique ||
        a.op != static_cast<std::uint8_t>(op)) {
        return std::nullopt;
    }
    return a.ino;
}

namespace {
void kill_at_fault_point(const char* where) {
    std::uint32_t expected = 0;
    if (!g_state->header().fault_fired.compare_exchange_strong(expected, 1)) return;
    log::warning("KCACHE_FSD_FAULT: killing this daemon {}", where);
    std::raise(SIGKILL);
}
}  // namespace

void after_commit() {
    if (g_fault == Op::none || t_recorded != g_fault || g_fault_any_outcome || !g_state) return;
    kill_at_fault_point("after a commit, before its reply");
}

void before_reply(Op op) {
    if (g_fault == Op::none || op != g_fault || !g_state) return;
    if (g_fault_any_outcome) return kill_at_fault_point("before a reply");
    after_commit();
}

}  // namespace kcache::fsd::resend
