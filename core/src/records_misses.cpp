// The records of the misses' tables (records.hpp; kcache/core/misses.hpp): classified
// misses and the evictions the classifier saw. Beside records.cpp, which holds the
// cache's own tables.
#include <cerrno>
#include <optional>

#include <fmt/format.h>

#include "records.hpp"

namespace kcache::core::records {

// Format 2 adds the node and namespace of a member compared across nodes; format 1
// records (written before) still decode, with neither.
constexpr std::uint8_t kMissFormat = 2;
constexpr std::uint8_t kEvictionFormat = 1;

std::string cut_line(std::string_view s) {
    if (s.size() <= kMaxLineBytes) return std::string(s);
    return std::string(s.substr(0, kMaxLineBytes - 3)) + "...";
}

std::string encode(const Miss& m) {
    std::string out;
    Writer w(out);
    w.u8(kMissFormat);
    w.i64(m.time_ns);
    w.u64(m.entry);
    w.str16(m.name.substr(0, kMaxPathLength));
    w.u8(static_cast<std::uint8_t>(m.producer));
    w.str16(m.family.substr(0, 1000));
    w.u8(static_cast<std::uint8_t>(m.cause));
    w.u64(m.stored_bytes);
    w.u64(m.compared);
    w.str16(m.compared_name.substr(0, kMaxPathLength));
    w.u16(static_cast<std::uint16_t>(m.fields.size()));
    for (const FieldDiff& f : m.fields) {
        w.str16(cut_line(f.file));
        w.str16(cut_line(f.field));
        w.str16(cut_line(f.before));
        w.str16(cut_line(f.after));
    }
    w.u16(static_cast<std::uint16_t>(m.lines.size()));
    for (const LineDiff& l : m.lines) {
        w.str16(cut_line(l.file));
        w.u32(l.line);
        w.str16(cut_line(l.before));
        w.str16(cut_line(l.after));
    }
    w.str16(cut_line(m.same_binary));
    w.i64(m.gone_ns);
    w.str16(cut_line(m.gone_why));
    w.u64(m.stack_distance);
    w.str16(cut_line(m.note));
    w.str16(cut_line(m.compared_host));
    w.str16(cut_line(m.compared_namespace));
    return out;
}

namespace {

// A miss's u16 count, then that many field differences.
Status read_fields(ByteReader& r, std::vector<FieldDiff>& out) {
    std::uint16_t n = 0;
    Status s = r.read(n);
    for (std::uint16_t i = 0; s && i < n; ++i) {
        FieldDiff f;
        s = str16(r, f.file);
        if (s) s = str16(r, f.field);
        if (s) s = str16(r, f.before);
        if (s) s = str16(r, f.after);
        out.push_back(std::move(f));
    }
    return s;
}

// A miss's u16 count, then that many line differences.
Status read_lines(ByteReader& r, std::vector<LineDiff>& out) {
    std::uint16_t n = 0;
    Status s = r.read(n);
    for (std::uint16_t i = 0; s && i < n; ++i) {
        LineDiff l;
        s = str16(r, l.file);
        if (s) s = r.read(l.line);
        if (s) s = str16(r, l.before);
        if (s) s = str16(r, l.after);
        out.push_back(std::move(l));
    }
    return s;
}

}  // namespace

Result<Miss> decode_miss(std::uint64_t seq, std::string_view bytes) {
    ByteReader r(bytes, "miss");
    Miss m;
    m.seq = seq;
    std::uint8_t version = 0, producer = 0, cause = 0;
    auto damaged = [&](const std::optional<Error>& why) {
        return fail(EIO, fmt::format("corrupt miss record {}{}", seq,
                                     why ? ": " + why->message : std::string()));
    };
    Status s = r.read(version, m.time_ns, m.entry);
    if (s) s = str16(r, m.name);
    if (s) s = r.read(producer);
    if (s) s = str16(r, m.family);
    if (s) s = r.read(cause, m.stored_bytes, m.compared);
    if (s) s = str16(r, m.compared_name);
    if (s) s = read_fields(r, m.fields);
    if (s) s = read_lines(r, m.lines);
    if (s) s = str16(r, m.same_binary);
    if (s) s = r.read(m.gone_ns);
    if (s) s = str16(r, m.gone_why);
    if (s) s = r.read(m.stack_distance);
    if (s) s = str16(r, m.note);
    if (s && version >= 2) s = str16(r, m.compared_host);
    if (s && version >= 2) s = str16(r, m.compared_namespace);
    if (s) s = r.expect_end();
    if (!s) return damaged(s.error());
    if (version < 1 || version > kMissFormat || cause < 1 || cause > 4)
        return damaged(std::nullopt);
    m.producer = static_cast<Producer>(producer);
    m.cause = static_cast<MissCause>(cause);
    return m;
}

std::string encode(const Eviction& e) {
    std::string out;
    Writer(out).write(kEvictionFormat, e.seq, e.time_ns, e.entry, e.why);  // as decoded
    return out;
}

Result<Eviction> decode_eviction(std::string_view bytes) {
    ByteReader r(bytes, "eviction");
    Eviction e;
    std::uint8_t version = 0, why = 0;
    Status s = r.read(version, e.seq, e.time_ns, e.entry, why);
    if (s) s = r.expect_end();
    if (!s || version != kEvictionFormat) return fail(EIO, "corrupt eviction record");
    e.why = static_cast<EventKind>(why);
    return e;
}

}  // namespace kcache::core::records
