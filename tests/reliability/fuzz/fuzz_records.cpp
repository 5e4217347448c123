// libFuzzer target for the decoders of the records core reads back from LMDB
// (core/src/records.hpp; built by tests/support/run_fuzz.sh with clang++-14).
//
// Input: one selector byte (which decoder, modulo their number), then the record's
// bytes. A damaged record must decode to a kCorruptDb (EUCLEAN) error, never crash. A record that
// decodes must be exactly what its encoder writes: re-encoding it gives the input back
// (no trailing bytes accepted, no field silently dropped), so what core reads is what
// was stored. A decoded producer is also given to producer_name(), as the CLI and GUI
// do when they print a damaged db.
//
// The misses' tables (selectors 9 and 10: a classified miss, an eviction) are evidence,
// not the cache: a damaged record of theirs is EIO (kcache/core/misses.hpp). A miss
// record of format 1, or one holding a string longer than the record keeps (the
// encoder cuts it), re-encodes otherwise; then that encoding must decode and re-encode
// to itself.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "kcache/core/integrity.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/types.hpp"
#include "records.hpp"

namespace {

namespace core = kcache::core;
namespace records = kcache::core::records;

void check(bool condition, const char* what) {
    if (!condition) {
        std::fprintf(stderr, "fuzz_records: contract broken: %s\n", what);
        std::abort();
    }
}

// A decoder's result: a kCorruptDb error with a message, or a value whose encoding is `in`.
template <class T>
void check_decoded(const core::Result<T>& decoded, std::string_view in, const char* what) {
    if (!decoded) {
        check(decoded.error().code == core::kCorruptDb && !decoded.error().message.empty(),
              "error is not kCorruptDb (EUCLEAN)");
        return;
    }
    const std::string encoded = records::encode(*decoded);
    if (encoded == in) return;
    // Inodes, entries and config of format 1 (schema 1), and blob references of format 1
    // (before schema 4), re-encode as format 2: then the
    // new encoding must decode to the same record.
    if (!in.empty() && in[0] == 1) {
        const auto again = [&] {
            if constexpr (std::is_same_v<T, records::Inode>)
                return records::decode_inode(42, encoded);
            else if constexpr (std::is_same_v<T, core::EntryInfo>)
                return records::decode_entry(42, encoded);
            else if constexpr (std::is_same_v<T, core::Config>)
                return records::decode_config(encoded);
            else if constexpr (std::is_same_v<T, records::BlobRef>)
                return records::decode_blob_ref(encoded);
            else
                return decoded;
        }();
        if (again && records::encode(*again) == encoded) return;
    }
    std::fprintf(stderr, "fuzz_records: %s does not re-encode to its input\n", what);
    std::abort();
}

// Whether every string of `m` is within what a miss record keeps (records.hpp).
bool within_limits(const core::Miss& m) {
    const auto line = [](const std::string& s) { return s.size() <= core::kMaxLineBytes; };
    bool ok = m.name.size() <= core::kMaxPathLength && m.family.size() <= 1000 &&
              m.compared_name.size() <= core::kMaxPathLength && line(m.same_binary) &&
              line(m.gone_why) && line(m.note) && line(m.compared_host) &&
              line(m.compared_namespace);
    for (const auto& f : m.fields)
        ok = ok && line(f.file) && line(f.field) && line(f.before) && line(f.after);
    for (const auto& l : m.lines) ok = ok && line(l.file) && line(l.before) && line(l.after);
    return ok;
}

void check_miss(std::string_view in) {
    const auto decoded = records::decode_miss(7, in);
    if (!decoded) {
        check(decoded.error().code == EIO && !decoded.error().message.empty(),
              "a miss record's error is not EIO");
        return;
    }
    (void)core::miss_cause_name(decoded->cause);
    (void)core::producer_name(decoded->producer);
    const std::string encoded = records::encode(*decoded);
    if (encoded == in) return;
    check(in[0] == 1 || !within_limits(*decoded), "miss does not re-encode to its input");
    const auto again = records::decode_miss(7, encoded);
    check(again && records::encode(*again) == encoded,
          "a miss's re-encoding does not re-encode to itself");
}

void check_eviction(std::string_view in) {
    const auto decoded = records::decode_eviction(in);
    if (!decoded) {
        check(decoded.error().code == EIO && !decoded.error().message.empty(),
              "an eviction record's error is not EIO");
        return;
    }
    check(records::encode(*decoded) == in, "eviction does not re-encode to its input");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
    switch (data[0] % 11) {
        case 0:
            check_decoded(records::decode_inode(42, in), in, "inode");
            break;
        case 1:
            check_decoded(records::decode_dirent(in), in, "dirent");
            break;
        case 2: {
            const auto ref = records::decode_blob_ref(in);
            check_decoded(ref, in, "blob reference");
            if (ref) (void)records::footprint(*ref);
            break;
        }
        case 3: {
            const auto entry = records::decode_entry(42, in);
            check_decoded(entry, in, "entry");
            if (entry) (void)core::producer_name(entry->producer);
            break;
        }
        case 4:
            check_decoded(records::decode_event(7, in), in, "event");
            break;
        case 5:
            check_decoded(records::decode_config(in), in, "config");
            break;
        case 7:
            check_decoded(records::decode_kind(in), in, "kind");
            break;
        case 8:
            check_decoded(records::decode_dictionary(in), in, "dictionary");
            break;
        case 9:
            check_miss(in);
            break;
        case 10:
            check_eviction(in);
            break;
        case 6: {
            const auto value = records::decode_u64(in, "counter");
            if (value)
                check(records::encode_u64(*value) == in, "u64 does not re-encode to its input");
            else
                check(value.error().code == core::kCorruptDb, "error is not kCorruptDb (EUCLEAN)");
            break;
        }
    }
    return 0;
}
