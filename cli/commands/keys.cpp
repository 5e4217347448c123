// Producers' signing keys and the trust file (kcache/remote/trust.hpp; docs/operations.md,
// "Trust model"): keys generate, list, trust, revoke.
//
// A private key lives in the keys directory (remote::default_keys_dir(), or --dir) as
// NAME.key, mode 0600, with its public key beside it as NAME.pub. The trust file (default
// remote::kDefaultTrustFile, or --trust-file) is what kcache-fsd --remote-trusted-keys
// and `kcache remote pull --remote-trusted-keys` read; trust and revoke edit it, and
// refuse one that breaks its rule (root or this user's, not group/world-writable).

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::cli {
namespace {

namespace fs = std::filesystem;

struct KeysOptions {
    std::string dir;         // --dir; empty: remote::default_keys_dir()
    std::string trust_file;  // --trust-file; empty: remote::kDefaultTrustFile
    std::string name;        // generate: NAME; trust: --name
    std::string key;         // trust, revoke: the key (text, file, id or name)
    bool json = false;
};

std::string keys_dir(const KeysOptions& o) {
    return o.dir.empty() ? remote::default_keys_dir() : o.dir;
}
std::string trust_path(const KeysOptions& o) {
    return o.trust_file.empty() ? std::string(remote::kDefaultTrustFile) : o.trust_file;
}

bool valid_name(std::string_view name) {
    return !name.empty() && name.size() <= 64 && name.front() != '.' &&
           std::all_of(name.begin(), name.end(), [](char c) {
               return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
           });
}

// A .pub file's line: the key, then its name.
std::pair<std::string, std::string> read_pub_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line))
        throw Failure(fmt::format("cannot read a public key from {}", path));
    std::istringstream words(line);
    std::string key, name;
    words >> key;
    std::getline(words >> std::ws, name);
    return {key, name};
}

int run_generate(const Cli&, const KeysOptions& o) {
    if (!valid_name(o.name))
        throw UsageError(fmt::format("bad key name '{}': 1-64 of A-Z a-z 0-9 . _ -", o.name));
    const std::string dir = keys_dir(o);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Failure(fmt::format("cannot make {}: {}", dir, ec.message()));
    ::chmod(dir.c_str(), 0700);  // private keys live there: owner only
    const std::string key_path = dir + "/" + o.name + ".key";
    const std::string pub_path = dir + "/" + o.name + ".pub";
    if (fs::exists(key_path) || fs::exists(pub_path))
        throw Failure(fmt::format("a key named {} is already in {}", o.name, dir));
    const remote::SigningKey key = check(remote::SigningKey::generate());
    check(key.save(key_path));
    const std::string line = fmt::format("{} {}\n", key.public_key().text(), o.name);
    {
        std::ofstream pub(pub_path);
        pub << line;
        if (!pub) throw Failure(fmt::format("cannot write {}", pub_path));
    }
    if (o.json) {
        print_json({{"name", o.name},
                    {"id", key.public_key().id()},
                    {"public_key", key.public_key().text()},
                    {"private_key_file", key_path},
                    {"public_key_file", pub_path}});
        return kExitOk;
    }
    Table t({"", ""});
    t.add({"name", o.name});
    t.add({"id", key.public_key().id()});
    t.add({"public key", key.public_key().text()});
    t.add({"private key", key_path + " (mode 0600: keep it secret)"});
    t.add({"public key file", pub_path});
    t.print();
    fmt::print(
        "\nsign pushes with --remote-signing-key {}; on readers, as root: kcache keys "
        "trust {}\n",
        key_path, pub_path);
    return kExitOk;
}

int run_list(const Cli&, const KeysOptions& o) {
    // One table: the private keys of the keys directory, then the trust file's keys.
    struct Row {
        std::string source, name, id, state, where;
    };
    std::vector<Row> rows;
    const std::string dir = keys_dir(o);
    std::error_code ec;
    std::vector<fs::path> pubs;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() == ".pub") pubs.push_back(e.path());
    }
    std::sort(pubs.begin(), pubs.end());
    for (const fs::path& p : pubs) {
        auto [text, name] = read_pub_line(p.string());
        auto key = remote::parse_public_key(text);
        fs::path priv = p;
        priv.replace_extension(".key");
        const bool has_private = fs::exists(priv);
        rows.push_back({"keys dir", name.empty() ? p.stem().string() : name,
                        key ? key->id() : std::string("?"),
                        !key          ? "unreadable"
                        : has_private ? "private key"
                                      : "public key only",
                        has_private ? priv.string() : p.string()});
    }
    const std::string trust = trust_path(o);
    std::string trust_note;
    if (auto file = remote::load_trust_file(trust)) {
        for (const remote::TrustedKey& k : file->keys) {
            rows.push_back({"trust file", k.name, k.key.id(), k.revoked ? "revoked" : "trusted",
                            k.key.text()});
        }
    } else {
        trust_note = file.error().code == ENOENT
                         ? fmt::format(
                               "no trust file at {}: pulls accept unsigned entries "
                               "(unverified)",
                               trust)
                         : file.error().message;
    }
    if (o.json) {
        nlohmann::json list = nlohmann::json::array();
        for (const Row& r : rows) {
            list.push_back({{"source", r.source},
                            {"name", r.name},
                            {"id", r.id},
                            {"state", r.state},
                            {"where", r.where}});
        }
        print_json({{"keys_dir", dir},
                    {"trust_file", trust},
                    {"trust_file_error",
                     trust_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(trust_note)},
                    {"keys", std::move(list)}});
        return kExitOk;
    }
    Table t({"SOURCE", "NAME", "ID", "STATE", "KEY OR FILE"});
    for (const Row& r : rows) t.add({r.source, r.name, r.id, r.state, r.where});
    if (!t.empty()) t.print();
    if (!trust_note.empty()) fmt::print(stderr, "kcache: note: {}\n", trust_note);
    return kExitOk;
}

// The trust file to edit: its keys when it exists (refused if it breaks the rule), none
// when it does not.
remote::TrustFile open_trust(const std::string& path) {
    auto file = remote::load_trust_file(path);
    if (file) return std::move(*file);
    if (file.error().code == ENOENT) {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) return {};
    }
    fail(file.error());
}

// The key that `text` names: a public key, or a file holding one (a .pub).
std::pair<remote::PublicKey, std::string> key_of(const std::string& text) {
    if (text.starts_with(remote::kPublicKeyPrefix))
        return {check(remote::parse_public_key(text)), std::string()};
    if (!fs::exists(text)) {
        throw Failure(fmt::format(
            "'{}' is neither a public key (kcache-ed25519:...) nor a file holding one", text));
    }
    auto [line, name] = read_pub_line(text);
    return {check(remote::parse_public_key(line), text), name};
}

int run_trust(const Cli&, const KeysOptions& o) {
    const std::string path = trust_path(o);
    auto [key, file_name] = key_of(o.key);
    const std::string name = o.name.empty() ? file_name : o.name;
    remote::TrustFile trust = open_trust(path);
    // &key = key: clang 14 (the thread-safety check) cannot capture a structured binding.
    auto it = std::find_if(trust.keys.begin(), trust.keys.end(),
                           [&key = key](const remote::TrustedKey& k) { return k.key == key; });
    std::string what = "trusted";
    if (it == trust.keys.end()) {
        trust.keys.push_back({key, name, false});
    } else {
        if (it->revoked)
            what = "trusted again (it was revoked)";
        else if (o.name.empty() || it->name == name)
            what = "already trusted";
        it->revoked = false;
        if (!o.name.empty()) it->name = name;
    }
    check(remote::save_trust_file(path, trust));
    fmt::print("{} {} {}{} in {}\n", what, key.id(), key.text(),
               name.empty() ? "" : " (" + name + ")", path);
    return kExitOk;
}

int run_revoke(const Cli&, const KeysOptions& o) {
    const std::string path = trust_path(o);
    remote::TrustFile trust = open_trust(path);
    // By id or name first (the file's keys), else a key or a .pub file.
    auto it = std::find_if(trust.keys.begin(), trust.keys.end(), [&](const remote::TrustedKey& k) {
        return k.key.id() == o.key || (!k.name.empty() && k.name == o.key);
    });
    if (it == trust.keys.end() &&
        (o.key.starts_with(remote::kPublicKeyPrefix) || fs::exists(o.key))) {
        auto [key, name] = key_of(o.key);
        it = std::find_if(trust.keys.begin(), trust.keys.end(),
                          [&key = key](const remote::TrustedKey& k) { return k.key == key; });
        if (it == trust.keys.end()) {
            // Named as revoked anyway, so that what it signed is refused as revoked.
            trust.keys.push_back({key, name, true});
            it = trust.keys.end() - 1;
        }
    }
    if (it == trust.keys.end())
        throw Failure(fmt::format("no key '{}' (id, name, key or .pub file) in {}", o.key, path));
    it->revoked = true;
    const std::string id = it->key.id();
    check(remote::save_trust_file(path, trust));
    fmt::print(
        "revoked {}{} in {}: what it signed is refused from now on; remove what this "
        "node already pulled with `kcache evict --signer {}`\n",
        id, it->name.empty() ? "" : " (" + it->name + ")", path, id);
    return kExitOk;
}

}  // namespace

void add_keys_commands(CLI::App& app, Cli& cli) {
    auto* keys = app.add_subcommand(
        "keys", "signing keys of producers and the trust file of readers (signed entries)");
    keys->require_subcommand(1);
    auto add_dir = [](CLI::App* sub, KeysOptions& o) {
        sub->add_option("--dir", o.dir,
                        "keys directory (default: $KCACHE_KEYS_DIR, else "
                        "$XDG_CONFIG_HOME/kcache/keys, else ~/.config/kcache/keys)")
            ->type_name("DIR");
    };
    auto add_trust_file = [](CLI::App* sub, KeysOptions& o) {
        sub->add_option("--trust-file", o.trust_file,
                        "trust file (default: " + std::string(remote::kDefaultTrustFile) + ")")
            ->type_name("FILE");
    };
    {
        auto opts = std::make_shared<KeysOptions>();
        auto* sub = keys->add_subcommand(
            "generate", "make an Ed25519 key pair: DIR/NAME.key (0600) and DIR/NAME.pub");
        sub->add_option("NAME", opts->name, "the key's name (a node, a CI job)")->required();
        add_dir(sub, *opts);
        sub->add_flag("--json", opts->json, "print JSON");
        on_run(sub, cli, opts, &run_generate);
    }
    {
        auto opts = std::make_shared<KeysOptions>();
        auto* sub = keys->add_subcommand("list", "the keys directory's keys and the trust file's");
        add_dir(sub, *opts);
        add_trust_file(sub, *opts);
        sub->add_flag("--json", opts->json, "print JSON");
        on_run(sub, cli, opts, &run_list);
    }
    {
        auto opts = std::make_shared<KeysOptions>();
        auto* sub = keys->add_subcommand("trust",
                                         "accept entries signed by a key (edits the "
                                         "trust file)");
        sub->add_option("KEY", opts->key, "a public key (kcache-ed25519:...) or a .pub file")
            ->required();
        sub->add_option("--name", opts->name, "its name in the trust file")->type_name("NAME");
        add_trust_file(sub, *opts);
        on_run(sub, cli, opts, &run_trust);
    }
    {
        auto opts = std::make_shared<KeysOptions>();
        auto* sub = keys->add_subcommand(
            "revoke", "refuse entries signed by a key from now on (edits the trust file)");
        sub->add_option("KEY", opts->key, "the key: its id, its name, the key or a .pub file")
            ->required();
        add_trust_file(sub, *opts);
        on_run(sub, cli, opts, &run_revoke);
    }
}

}  // namespace kcache::cli
