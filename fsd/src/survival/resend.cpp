#include "resend.hpp"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "faults.hpp"
#include "log.hpp"

namespace kcache::fsd {

namespace {

using resend::Op;

// The request this thread processes next, as its transport noted it: the one seam
// libfuse forces (resend.hpp). Only Resend::note and Resend::current touch it.
thread_local std::uint64_t t_unique = 0;

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

}  // namespace

const char* resend::name_of(Op op) {
    const auto i = static_cast<std::size_t>(op);
    return i < std::size(kOpNames) ? kOpNames[i] : "?";
}

bool resend::proven_in_transaction(Op op) {
    return op == Op::setxattr || op == Op::removexattr;
}

Resend::Resend(StateFile* state) : m_state(state) {
    if (!state) return;
    const NamedFault named = named_fault();  // faults.hpp's table
    if (named.fault == Fault::kill_after_commit || named.fault == Fault::kill_before_reply) {
        m_fault = parse_op(std::string(named.argument));
        m_fault_any_outcome = named.fault == Fault::kill_before_reply;
    }
    if (named.fault != Fault::none && named.fault != Fault::slow_uploader && m_fault == Op::none)
        log::warning("KCACHE_FSD_FAULT={}: not a fault point (ignored)", fault_point());
}

void Resend::note(std::uint64_t unique) const {
    t_unique = unique;
}

RequestContext Resend::current() const {
    return RequestContext{t_unique};
}

AnswerRecord& Resend::slot_of(std::uint64_t unique) const {
    // Uniques grow by 2 per request: those in flight at once do not share a slot.
    return m_state->header().answers[(unique >> 1) % kAnswerSlots];
}

void Resend::record(RequestContext request, Op op, core::Ino ino) const {
    const std::uint64_t unique = request.first_unique();
    if (!m_state || unique == 0) return;
    AnswerRecord& a = slot_of(unique);
    a.unique.store(0, std::memory_order_relaxed);
    a.op = static_cast<std::uint8_t>(op);
    a.ino = ino;
    a.unique.store(unique, std::memory_order_release);
}

std::optional<core::Ino> Resend::recorded(RequestContext request, Op op) const {
    if (!m_state || !request.resent()) return std::nullopt;
    const std::uint64_t unique = request.first_unique();
    const AnswerRecord& a = slot_of(unique);
    if (a.unique.load(std::memory_order_acquire) != unique ||
        a.op != static_cast<std::uint8_t>(op)) {
        return std::nullopt;
    }
    return a.ino;
}

void Resend::kill_at_fault_point(const char* where) const {
    std::uint32_t expected = 0;
    if (!m_state->header().fault_fired.compare_exchange_strong(expected, 1)) return;
    log::warning("KCACHE_FSD_FAULT: killing this daemon {}", where);
    std::raise(SIGKILL);
}

void Resend::before_reply(Op op, bool recorded, bool committed) const {
    if (!m_state || m_fault == Op::none || op != m_fault) return;
    if (resend::proven_in_transaction(op)) {
        // Whatever the outcome: kill_before_reply, or kill_after_commit once it recorded.
        if (m_fault_any_outcome) return kill_at_fault_point("before a reply");
        if (recorded) kill_at_fault_point("after a commit, before its reply");
        return;
    }
    if (committed && recorded && !m_fault_any_outcome)
        kill_at_fault_point("after a commit, before its reply");
}

}  // namespace kcache::fsd
