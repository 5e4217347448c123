// Entry images (entry_image.hpp): one reader, one validator, one writer.
#include <cerrno>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/entry_image.hpp"

using namespace kcache;
using test::err;

namespace {

core::ImageFile file(std::string path, std::string content) {
    core::ImageFile f;
    f.path = std::move(path);
    f.mode = 0644;
    f.size = content.size();
    f.digest = core::digest_of(content);
    f.content = std::move(content);
    f.has_content = true;
    return f;
}

core::ImageFile dir(std::string path) {
    core::ImageFile f;
    f.path = std::move(path);
    f.type = core::FileType::directory;
    f.mode = 0755;
    return f;
}

core::ImageFile symlink_file(std::string path, std::string target) {
    core::ImageFile f;
    f.path = std::move(path);
    f.type = core::FileType::symlink;
    f.target = std::move(target);
    return f;
}

core::EntryImage node_image(std::string name) {
    core::EntryImage image;
    image.name = std::move(name);
    image.files = {file("kernel.json", "{}"), dir("sub"), file("sub/kernel.cubin", "cubin")};
    return image;
}

std::string refusal(const core::EntryImage& image) {
    auto s = core::check_image(image);
    REQUIRE_FALSE(s);
    CHECK(s.error().code == EINVAL);
    return s.error().message;
}

}  // namespace

TEST_CASE("entry image: read from the db, written into another, the same entry",
          "[core][entry_image]") {
    test::TestStore src;
    const std::string k = "c0ffee0123456789abcdef0123456789";
    src.put(k + "/kernel.json", "{}");
    src.put(k + "/sub/kernel.cubin", std::string(100'000, 'c'));
    {
        auto w = src.write();
        KC_MUST(w.symlink(src.ino(k), "link", "kernel.json"));
        KC_MUST(w.commit());
    }
    auto rtxn = src.read();
    const auto image = KC_MUST(core::read_image(rtxn, src.entry(k), true));
    REQUIRE(image.files.size() == 4);
    CHECK(image.kind == core::EntryKind::node);
    CHECK(image.dir_mtime_ns.has_value());
    KC_MUST(core::check_image(image));

    test::TestStore dst;
    {
        auto w = dst.write();
        KC_MUST(core::write_image(w, image));
        KC_MUST(w.commit());
    }
    auto txn = dst.read();
    const auto again = KC_MUST(core::read_image(txn, dst.entry(k), true));
    REQUIRE(again.files.size() == image.files.size());
    for (std::size_t i = 0; i < image.files.size(); ++i) {
        INFO(image.files[i].path);
        CHECK(again.files[i].path == image.files[i].path);
        CHECK(again.files[i].type == image.files[i].type);
        CHECK(again.files[i].mode == image.files[i].mode);
        CHECK(again.files[i].mtime_ns == image.files[i].mtime_ns);
        CHECK(again.files[i].content == image.files[i].content);
        CHECK(again.files[i].digest == image.files[i].digest);
        CHECK(again.files[i].target == image.files[i].target);
    }
    CHECK(*again.dir_mtime_ns == *image.dir_mtime_ns);
}

TEST_CASE("entry image: referenced contents come from the writer's caller, a missing one fails",
          "[core][entry_image]") {
    auto image = node_image("k");
    image.files[2].has_content = false;
    const std::string cubin = image.files[2].content;
    image.files[2].content.clear();
    KC_MUST(core::check_image(image));
    test::TestStore db;
    {
        auto w = db.write();
        auto s = core::write_image(w, image);
        REQUIRE_FALSE(s);
        CHECK(s.error().code == EIO);
    }
    auto w = db.write();
    core::ImageWrite how;
    how.content = [&](const core::ImageFile& f) -> std::optional<std::string_view> {
        if (f.digest == core::digest_of(cubin)) return cubin;
        return std::nullopt;
    };
    KC_MUST(core::write_image(w, image, how));
    KC_MUST(w.commit());
    CHECK(db.entry("k").files == 2);
}

TEST_CASE("entry image: the validator's rules", "[core][entry_image]") {
    KC_MUST(core::check_image(node_image("k")));
    KC_MUST(core::check_image(node_image("grp/k")));

    CHECK(refusal(node_image("../k")).find("refused entry") != std::string::npos);
    CHECK(refusal(node_image("/k")).find("refused entry") != std::string::npos);
    CHECK(refusal(node_image("a//k")).find("refused entry") != std::string::npos);

    auto escape = node_image("k");
    escape.files[0].path = "../../etc/x";
    CHECK(refusal(escape).find("refused file") != std::string::npos);

    auto twice = node_image("k");
    twice.files.push_back(twice.files[0]);
    CHECK(refusal(twice).find("appears twice") != std::string::npos);

    auto orphan = node_image("k");
    orphan.files.push_back(file("nodir/x", "x"));
    CHECK(refusal(orphan).find("is not under a directory") != std::string::npos);

    auto below_file = node_image("k");
    below_file.files.push_back(file("kernel.json/x", "x"));
    CHECK(refusal(below_file).find("is not under a directory") != std::string::npos);

    auto out = node_image("k");
    out.files.push_back(symlink_file("sub/l", "../../../etc/passwd"));
    CHECK(refusal(out).find("refused symlink") != std::string::npos);
    auto abs = node_image("k");
    abs.files.push_back(symlink_file("l", "/etc/passwd"));
    CHECK(refusal(abs).find("refused symlink") != std::string::npos);
    auto inside = node_image("k");
    inside.files.push_back(symlink_file("sub/l", "../kernel.json"));
    KC_MUST(core::check_image(inside));

    auto short_content = node_image("k");
    short_content.files[0].size = 3;
    CHECK(refusal(short_content).find("not its size") != std::string::npos);

    core::EntryImage stem;
    stem.name = "jax/jit_f-1a2b";
    stem.kind = core::EntryKind::stem;
    stem.stem = "jit_f-1a2b";
    stem.files = {file("jit_f-1a2b-cache", "c"), file("jit_f-1a2b-atime", "a")};
    KC_MUST(core::check_image(stem));
    auto wrong_stem = stem;
    wrong_stem.stem = "jit_g";
    CHECK(refusal(wrong_stem).find("its directory and its stem") != std::string::npos);
    auto foreign = stem;
    foreign.files.push_back(file("other-cache", "o"));
    CHECK(refusal(foreign).find("is not a file of stem entry") != std::string::npos);
    auto nested = stem;
    nested.files.push_back(dir("jit_f-1a2b-dir"));
    CHECK(refusal(nested).find("is not a file of stem entry") != std::string::npos);
}

TEST_CASE("entry image: a stem entry written and read back", "[core][entry_image]") {
    const std::string stem_name =
        "jit_g-0f3c6e8a1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";
    core::EntryImage stem;
    stem.name = "jax/" + stem_name;
    stem.kind = core::EntryKind::stem;
    stem.stem = stem_name;
    stem.files = {file(stem_name + "-atime", "a"), file(stem_name + "-cache", "exe")};
    KC_MUST(core::check_image(stem));
    test::TestStore db;
    {
        auto w = db.write();
        KC_MUST(core::write_image(w, stem));
        KC_MUST(w.commit());
    }
    const auto e = db.entry(stem.name);
    CHECK(e.kind == core::EntryKind::stem);
    CHECK(e.files == 2);
    auto txn = db.read();
    const auto back = KC_MUST(core::read_image(txn, e, false));
    CHECK(back.stem == stem_name);
    REQUIRE(back.files.size() == 2);
    CHECK(back.files[1].path == stem_name + "-cache");
    CHECK_FALSE(back.files[1].has_content);
    CHECK(back.files[1].digest == core::digest_of("exe"));
}
