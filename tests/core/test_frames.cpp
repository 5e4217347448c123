// Frames and dictionaries as they travel between dbs (core/include/kcache/core/frames.hpp):
// a frame's Dictionary_ID rewritten, the portable digest, a frame stored as it is under
// the receiver's id, and hostile frames and dictionaries refused with nothing stored.
#include <cerrno>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/dictionaries.hpp"
#include "kcache/core/frames.hpp"
#include "kernel_text.hpp"

using namespace kcache;
using namespace kcache::test;
using core::Counter;

namespace {

core::DictionaryPolicy small_policy() {
    core::DictionaryPolicy p;
    p.min_blobs = 16;
    p.min_raw_bytes = 16 * 1024;
    return p;
}

// A db whose PTX and JSON kinds have dictionaries, and kernels [100, 110) stored with them.
void trained(TestStore& ts) {
    for (int i = 0; i < 40; ++i) {
        ts.put(kernel_dir(i) + "/k.ptx", ptx(i));
        ts.put(kernel_dir(i) + "/k.json", metadata(i));
    }
    KC_MUST(core::train_dictionaries(ts.store(), small_policy()));
    for (int i = 100; i < 110; ++i) {
        ts.put(kernel_dir(i) + "/k.ptx", ptx(i));
        ts.put(kernel_dir(i) + "/k.json", metadata(i));
    }
}

core::StoredFrame frame_of(TestStore& ts, const std::string& content) {
    auto txn = ts.read();
    auto frame = KC_MUST(core::read_frame(txn, core::digest_of(content)));
    REQUIRE(frame);
    return *frame;
}

std::string dictionary_of(TestStore& ts, std::uint32_t id) {
    auto txn = ts.read();
    return KC_MUST(core::read_dictionary(txn, id));
}

core::KindStats kind(TestStore& ts, std::string_view name) {
    auto txn = ts.read();
    for (auto& k : KC_MUST(core::kind_stats(txn))) {
        if (k.name == name) return k;
    }
    return {};
}

std::string with_id(std::string dictionary, std::uint32_t id) {
    for (int i = 0; i < 4; ++i)
        dictionary[static_cast<std::size_t>(4 + i)] = static_cast<char>((id >> (8 * i)) & 0xff);
    return dictionary;
}

}  // namespace

TEST_CASE(
    "frames: a frame's Dictionary_ID is rewritten in 0, 1, 2 or 4 bytes and it still "
    "decompresses",
    "[frames]") {
    TestStore ts;
    trained(ts);
    const std::string content = ptx(103);
    const core::StoredFrame f = frame_of(ts, content);
    REQUIRE(f.dictionary != 0);
    CHECK(f.raw_size == content.size());
    CHECK(KC_MUST(core::frame_dictionary(f.frame)) == f.dictionary);
    const std::string dictionary = dictionary_of(ts, f.dictionary);
    CHECK(KC_MUST(core::decompress_frame(f.frame, dictionary, f.raw_size)) == content);

    // zstd's own width for the id kcache gives (32768 and up): 2 bytes.
    REQUIRE(f.dictionary < 0x10000);
    for (const std::uint32_t id : {0x7fu, 0x1234u, 0x12345678u}) {
        INFO(id);
        const std::string rewritten = KC_MUST(core::with_frame_dictionary(f.frame, id));
        CHECK(KC_MUST(core::frame_dictionary(rewritten)) == id);
        const std::size_t width = id < 0x100 ? 1 : id < 0x10000 ? 2 : 4;
        CHECK(rewritten.size() == f.frame.size() - 2 + width);
        CHECK(KC_MUST(core::decompress_frame(rewritten, with_id(dictionary, id), f.raw_size)) ==
              content);
        // Back to the stored id: the frame as stored.
        CHECK(KC_MUST(core::with_frame_dictionary(rewritten, f.dictionary)) == f.frame);
    }
    // Id 0: no field at all, and such a frame needs no dictionary to be given (nor takes one).
    const std::string none = KC_MUST(core::with_frame_dictionary(f.frame, 0));
    CHECK(none.size() == f.frame.size() - 2);
    CHECK(KC_MUST(core::frame_dictionary(none)) == 0);
    CHECK(core::decompress_frame(none, dictionary, f.raw_size).error().code == EBADMSG);

    // A frame without a dictionary (content stored before training) reads as one too.
    const core::StoredFrame plain = frame_of(ts, ptx(3));
    CHECK(plain.dictionary == 0);
    CHECK(KC_MUST(core::decompress_frame(plain.frame, "", plain.raw_size)) == ptx(3));
    // Content stored raw is no frame.
    ts.put("raw/tiny", "tiny");
    auto txn = ts.read();
    CHECK_FALSE(KC_MUST(core::read_frame(txn, core::digest_of("tiny"))));
}

TEST_CASE("frames: a dictionary's digest is the same whatever id it carries", "[frames]") {
    TestStore ts;
    trained(ts);
    const auto p = kind(ts, "triton/ptx");
    const auto j = kind(ts, "triton/json");
    REQUIRE(p.dictionary != 0);
    REQUIRE(j.dictionary != 0);
    const std::string dictionary = dictionary_of(ts, p.dictionary);
    CHECK(core::dictionary_digest(dictionary) ==
          core::dictionary_digest(with_id(dictionary, 99999)));
    CHECK_FALSE(core::dictionary_digest(dictionary) == core::digest_of(dictionary));
    CHECK_FALSE(core::dictionary_digest(dictionary) ==
                core::dictionary_digest(dictionary_of(ts, j.dictionary)));
    std::string other = dictionary;
    other[other.size() / 2] = static_cast<char>(other[other.size() / 2] ^ 1);
    CHECK_FALSE(core::dictionary_digest(dictionary) == core::dictionary_digest(other));
}

TEST_CASE(
    "frames: an offered frame is stored as it is, under the receiver's id for its "
    "dictionary",
    "[frames]") {
    TestStore a, b;
    trained(a);
    // B has a dictionary of its own first, so its next id differs from A's.
    for (int i = 500; i < 540; ++i) b.put(kernel_dir(i) + "/k.json", metadata(i));
    KC_MUST(core::train_dictionaries(b.store(), small_policy()));
    const std::uint64_t dedup = b.counter(Counter::dedup_hits);

    const core::StoredFrame f1 = frame_of(a, ptx(101)), f2 = frame_of(a, ptx(102));
    REQUIRE(f1.dictionary == f2.dictionary);
    const std::string dictionary = dictionary_of(a, f1.dictionary);
    std::uint32_t local = 0;
    KC_MUST(b->update([&](core::WriteTxn& txn) -> core::Status {
        auto ids = KC_MUST(core::dictionary_ids(txn));
        const std::size_t before = ids.size();
        for (int i : {101, 102}) {
            const core::StoredFrame& f = i == 101 ? f1 : f2;
            core::PulledFrame pulled;
            pulled.digest = core::digest_of(ptx(i));
            pulled.raw_size = f.raw_size;
            pulled.frame = f.frame;
            pulled.dictionary = dictionary;
            pulled.name = "k.ptx";
            pulled.producer = core::Producer::triton;
            CHECK(KC_MUST(core::offer_frame(txn, pulled, ids)));
            CHECK_FALSE(KC_MUST(core::offer_frame(txn, pulled, ids)));  // stored already
            put(txn, kernel_dir(i) + "/k.ptx", ptx(i));
        }
        CHECK(ids.size() == before + 1);  // one dictionary for both
        local = ids.back().second;
        return {};
    }));
    REQUIRE(local != 0);
    CHECK(local != f1.dictionary);
    for (int i : {101, 102}) {
        const core::StoredFrame& f = i == 101 ? f1 : f2;
        const core::StoredFrame got = frame_of(b, ptx(i));
        CHECK(got.dictionary == local);
        CHECK(got.frame == KC_MUST(core::with_frame_dictionary(f.frame, local)));
        CHECK(b.get(kernel_dir(i) + "/k.ptx") == ptx(i));
    }
    CHECK(dictionary_of(b, local) == with_id(dictionary, local));
    // The kind had none: the pulled one is its current one now, refcounted by its blobs.
    const auto p = kind(b, "triton/ptx");
    CHECK(p.dictionary == local);
    CHECK(p.dictionaries == 1);
    CHECK(p.blobs == 2);
    CHECK(b.counter(Counter::dedup_hits) == dedup);  // stored, not deduplicated
    check_consistent(b.store());
    // New PTX in B is compressed with it.
    b.put(kernel_dir(120) + "/k.ptx", ptx(120));
    CHECK(frame_of(b, ptx(120)).dictionary == local);
    check_consistent(b.store());
}

TEST_CASE("frames: a hostile frame or dictionary is EBADMSG and nothing is stored", "[frames]") {
    TestStore a, b;
    trained(a);
    const std::string content = ptx(104);
    const core::StoredFrame f = frame_of(a, content);
    const std::string dictionary = dictionary_of(a, f.dictionary);
    const std::string other = dictionary_of(a, kind(a, "triton/json").dictionary);

    std::string flipped = f.frame;
    flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
    std::string damaged = dictionary;  // its content (the second half) changed throughout
    for (std::size_t i = damaged.size() / 2; i < damaged.size(); i += 16)
        damaged[i] = static_cast<char>(damaged[i] ^ 0x55);
    struct Case {
        const char* what;
        std::string frame, dictionary;
        core::Digest digest;
    };
    const std::vector<Case> cases = {
        {"header cut before its Dictionary_ID", f.frame.substr(0, 6), dictionary,
         core::digest_of(content)},
        {"no frame magic", std::string("\x28\xb5\x2f\x00", 4) + f.frame.substr(4), dictionary,
         core::digest_of(content)},
        {"a flipped byte in the frame", flipped, dictionary, core::digest_of(content)},
        {"another dictionary", f.frame, with_id(other, f.dictionary), core::digest_of(content)},
        {"a damaged dictionary", f.frame, damaged, core::digest_of(content)},
        {"no dictionary for a frame that needs one", f.frame, "", core::digest_of(content)},
        {"not a dictionary", f.frame, std::string(64, 'x'), core::digest_of(content)},
        {"content of another digest", f.frame, dictionary, core::digest_of(ptx(105))},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        auto txn = b.write();
        auto ids = KC_MUST(core::dictionary_ids(txn));
        core::PulledFrame pulled;
        pulled.digest = c.digest;
        pulled.raw_size = content.size();
        pulled.frame = c.frame;
        pulled.dictionary = c.dictionary;
        pulled.name = "k.ptx";
        pulled.producer = core::Producer::triton;
        auto offered = core::offer_frame(txn, pulled, ids);
        REQUIRE_FALSE(offered);
        CHECK(offered.error().code == EBADMSG);
        CHECK(ids.empty());
        CHECK_FALSE(KC_MUST(txn.has_blob(c.digest)));
        // Even committed, the refused offer left nothing.
        KC_MUST(txn.commit());
        CHECK(b.counter(Counter::blobs) == 0);
        auto r = b.read();
        CHECK(KC_MUST(core::dictionary_ids(r)).empty());
    }
    // decompress_frame alone: a size it does not decompress to, a size too big for a frame.
    CHECK(core::decompress_frame(f.frame, dictionary, content.size() + 1).error().code == EBADMSG);
    CHECK(core::decompress_frame(f.frame, dictionary, core::kSegmentedSize).error().code ==
          EBADMSG);
    CHECK(core::with_frame_dictionary(f.frame.substr(0, 6), 1).error().code == EBADMSG);
}
