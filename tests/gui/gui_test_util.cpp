#include "gui_test_util.hpp"

#include <cerrno>
#include <stdexcept>

namespace kcache::test {
namespace {

void must(const core::Status& status, const std::string& what) {
    if (!status) throw std::runtime_error(what + ": " + status.error().message);
}
template <class T>
T must(core::Result<T> result, const std::string& what) {
    if (!result) throw std::runtime_error(what + ": " + result.error().message);
    return std::move(*result);
}

}  // namespace

GuiDb::GuiDb() {
    core::OpenOptions options;
    options.path = path();
    options.durability = core::Durability::none;
    options.clock = m_clock.clock();
    m_store = must(core::Store::open(options), "open test db");
}

core::Ino GuiDb::add_entry(const std::string& name, const Files& files) {
    core::Ino ino = 0;
    must(m_store->update([&](core::WriteTxn& txn) -> core::Status {
        auto dir = must(txn.mkdir(core::kRootIno, name, 0755), "mkdir " + name);
        ino = dir.ino;
        for (const auto& [file, content] : files) {
            auto attr = must(txn.create(dir.ino, file, 0644), "create " + file);
            must(txn.write(attr.ino, content, core::Origin{4242, "testcc"}), "write " + file);
        }
        return {};
    }),
         "add entry " + name);
    return ino;
}

void GuiDb::add_file(const std::string& entry, const std::string& file,
                     const std::string& content) {
    must(m_store->update([&](core::WriteTxn& txn) -> core::Status {
        auto dir = must(txn.lookup(core::kRootIno, entry), "lookup " + entry);
        auto attr = must(txn.create(dir.ino, file, 0644), "create " + file);
        must(txn.write(attr.ino, content, core::Origin{4242, "testcc"}), "write " + file);
        return {};
    }),
         "add file " + file);
}

void GuiDb::hit(core::Ino entry, int times) {
    must(m_store->update([&](core::WriteTxn& txn) -> core::Status {
        for (int i = 0; i < times; ++i) must(txn.record_hit(entry), "hit");
        return {};
    }),
         "record hits");
}

void GuiDb::evict(core::Ino entry) {
    must(m_store->update([&](core::WriteTxn& txn) { return txn.evict_entry(entry); }), "evict");
}

void GuiDb::pin(core::Ino entry, bool pinned) {
    must(m_store->update([&](core::WriteTxn& txn) { return txn.set_pinned(entry, pinned); }),
         "pin");
}

bool GuiDb::exists(const std::string& name) {
    auto txn = must(m_store->read(), "read");
    auto entry = txn.find_entry(name);
    if (entry) return true;
    if (entry.error().code != ENOENT) throw std::runtime_error(entry.error().message);
    return false;
}

std::string fake_cubin(int seed, std::size_t size) {
    std::string bytes(size, '\0');
    std::uint64_t x = static_cast<std::uint64_t>(seed) * 0x9e3779b97f4a7c15ull + 1;
    for (char& c : bytes) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<char>(x & 0xff);
    }
    bytes.replace(0, 4,
                  "\x7f"
                  "ELF");
    return bytes;
}

}  // namespace kcache::test
