// The lookup policy (fsd/src/handlers/lookup_policy.hpp) without FUSE: a scripted view records
// which questions decide_lookup asks, in which order, and the test checks the answer and
// that order (some questions record state in SingleFlight, so the order is the policy).
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "kernel_attrs.hpp"
#include "lookup_policy.hpp"

namespace {

using kcache::core::Attr;
using kcache::core::EntryInfo;
using kcache::core::EntryKind;
using kcache::core::Ino;
using kcache::core::Result;
using kcache::fsd::decide_lookup;
using kcache::fsd::LookupAction;
using kcache::fsd::LookupRequest;
using kcache::fsd::LookupView;
using kcache::fsd::RemoteTier;
using kcache::fsd::SingleFlight;
using Kind = LookupAction::Kind;
using Found = RemoteTier::Found;

Attr dir_attr(Ino ino, Ino entry) {
    Attr a;
    a.ino = ino;
    a.mode = S_IFDIR | 0755;
    a.entry = entry;
    return a;
}

Result<Attr> missing() {
    return kcache::core::fail(ENOENT, "no such name");
}

// Answers from its fields; records every question.
struct Script final : LookupView {
    Result<Attr> name = missing();
    std::optional<SingleFlight::Awaited> awaited;
    Result<Attr> dir = dir_attr(2, 2);
    Result<EntryInfo> entry_info = EntryInfo{};
    bool active = false, taken_over = false, was_retried = false, first = false;
    Found found;
    std::vector<std::string> asked;

    Result<Attr> lookup() override {
        asked.push_back("lookup");
        return name;
    }
    std::optional<SingleFlight::Awaited> retrying(Ino) override {
        asked.push_back("retrying");
        return awaited;
    }
    Result<Attr> parent() override {
        asked.push_back("parent");
        return dir;
    }
    Result<EntryInfo> entry(Ino) override {
        asked.push_back("entry");
        return entry_info;
    }
    bool filling(Ino) override {
        asked.push_back("filling");
        return active;
    }
    bool just_taken_over() override {
        asked.push_back("just_taken_over");
        return taken_over;
    }
    bool retried() override {
        asked.push_back("retried");
        return was_retried;
    }
    bool retry_first(Ino) override {
        asked.push_back("retry_first");
        return first;
    }
    Found find() override {
        asked.push_back("find");
        return found;
    }
};

LookupRequest request(bool remote = false, bool read_through = false, bool may_wait = true) {
    return {2, "x.cubin", read_through, may_wait, true, remote};
}

using Asked = std::vector<std::string>;

}  // namespace

TEST_CASE(
    "lookup policy: a found name is answered, and a directory waits first when the thread "
    "retries a walk (single flight, step 2)",
    "[lookup_policy]") {
    Script s;
    s.name = dir_attr(5, 5);
    SECTION("no retry recorded: found, after asking single flight") {
        auto a = decide_lookup(s, request());
        CHECK(a.kind == Kind::found);
        CHECK(a.attr.ino == 5);
        CHECK(s.asked == Asked{"lookup", "retrying"});
    }
    SECTION("the thread's retry: wait for the name it missed") {
        s.awaited = SingleFlight::Awaited{5, "x.cubin", 5, 42};
        auto a = decide_lookup(s, request());
        CHECK(a.kind == Kind::wait);
        CHECK(a.awaited.name == "x.cubin");
        CHECK(s.asked == Asked{"lookup", "retrying"});
    }
    SECTION("an answer after a wait never waits again") {
        s.awaited = SingleFlight::Awaited{5, "x.cubin", 5, 42};
        auto a = decide_lookup(s, request(false, false, false));
        CHECK(a.kind == Kind::found);
        CHECK(s.asked == Asked{"lookup"});
    }
    SECTION("single flight disabled: never asked") {
        auto r = request();
        r.flights = false;
        CHECK(decide_lookup(s, r).kind == Kind::found);
        CHECK(s.asked == Asked{"lookup"});
    }
}

TEST_CASE("lookup policy: an error of the db other than ENOENT is the answer", "[lookup_policy]") {
    Script s;
    s.name = kcache::core::fail(EIO, "broken");
    auto a = decide_lookup(s, request(true, true));
    CHECK(a.kind == Kind::error);
    CHECK(a.error.code == EIO);
    CHECK(s.asked == Asked{"lookup"});
}

TEST_CASE(
    "lookup policy: a miss inside an entry another compile fills is ESTALE (step 1), "
    "but not just after a takeover nor for the thread's retry (step 3)",
    "[lookup_policy]") {
    Script s;
    s.active = true;
    SECTION("step 1") {
        s.first = true;
        CHECK(decide_lookup(s, request(true, true)).kind == Kind::estale);
        CHECK(s.asked ==
              Asked{"lookup", "parent", "filling", "just_taken_over", "retried", "retry_first"});
    }
    SECTION("just after a takeover: a negative entry of timeout 0, single flight not asked") {
        s.taken_over = true;
        auto a = decide_lookup(s, request());
        CHECK(a.kind == Kind::negative);
        CHECK(a.negative_timeout == 0);
        CHECK(s.asked == Asked{"lookup", "parent", "filling", "just_taken_over"});
    }
    SECTION("the retry: as it stands, the tier asked next") {
        s.was_retried = true;
        s.found.kind = Found::Kind::entry;
        s.found.name = "triton/abc";
        auto a = decide_lookup(s, request(true, true));
        CHECK(a.kind == Kind::fetch);
        CHECK(a.remote_name == "triton/abc");
        CHECK(s.asked ==
              Asked{"lookup", "parent", "filling", "just_taken_over", "retried", "find"});
    }
    SECTION("no other compile: negative, timeout 0") {
        auto a = decide_lookup(s, request());
        CHECK(a.kind == Kind::negative);
        CHECK(a.negative_timeout == 0);
        CHECK(s.asked ==
              Asked{"lookup", "parent", "filling", "just_taken_over", "retried", "retry_first"});
    }
}

TEST_CASE(
    "lookup policy: a miss outside a filled entry keeps the kernel's negative entry long, "
    "0 in an unpopulated entry",
    "[lookup_policy]") {
    Script s;
    SECTION("populated entry") {
        EntryInfo e;
        e.kind = EntryKind::node;
        e.populated = true;
        s.entry_info = e;
        auto a = decide_lookup(s, request());
        CHECK(a.kind == Kind::negative);
        CHECK(a.negative_timeout == kcache::fsd::kernel::kNegativeTimeout);
        CHECK(s.asked == Asked{"lookup", "parent", "filling", "entry"});
    }
    SECTION("unpopulated entry") {
        auto a = decide_lookup(s, request());
        CHECK(a.negative_timeout == 0);
    }
    SECTION("outside every entry: single flight not asked") {
        s.dir = dir_attr(2, 0);
        auto a = decide_lookup(s, request());
        CHECK(a.negative_timeout == kcache::fsd::kernel::kNegativeTimeout);
        CHECK(s.asked == Asked{"lookup", "parent"});
    }
    SECTION("a bookkeeping name: single flight not asked") {
        auto r = request();
        r.name = ".lock";
        decide_lookup(s, r);
        CHECK(s.asked == Asked{"lookup", "parent"});
    }
}

TEST_CASE("lookup policy: the shared tier: container, entry, containers unknown, none",
          "[lookup_policy]") {
    Script s;
    s.dir = dir_attr(2, 0);  // outside every entry: single flight has nothing to say
    SECTION("a container is made, read-through or not") {
        s.found.kind = Found::Kind::container;
        CHECK(decide_lookup(s, request(true, false)).kind == Kind::make_container);
    }
    SECTION("an entry is fetched with read-through") {
        s.found.kind = Found::Kind::entry;
        s.found.name = "triton/abc";
        s.found.may_appear = true;
        auto a = decide_lookup(s, request(true, true));
        CHECK(a.kind == Kind::fetch);
        CHECK(s.asked == Asked{"lookup", "parent", "find"});
    }
    SECTION("after the read-through: a negative entry kept briefly") {
        s.found.kind = Found::Kind::entry;
        s.found.may_appear = true;
        auto a = decide_lookup(s, request(true, false));
        CHECK(a.kind == Kind::negative);
        CHECK(a.negative_timeout == RemoteTier::kNegativeTimeoutS);
    }
    SECTION("containers not read yet: wait for them") {
        s.found.kind = Found::Kind::unknown;
        CHECK(decide_lookup(s, request(true, true)).kind == Kind::containers);
    }
    SECTION("nothing of the tier: negative, the kernel's long timeout") {
        auto a = decide_lookup(s, request(true, true));
        CHECK(a.kind == Kind::negative);
        CHECK(a.negative_timeout == kcache::fsd::kernel::kNegativeTimeout);
    }
    SECTION("no tier: never asked") {
        decide_lookup(s, request(false, true));
        CHECK(s.asked == Asked{"lookup", "parent"});
    }
}
