#include "kcache/gui/duplicates.hpp"

#include <algorithm>

#include "kcache/core/roles.hpp"

namespace kcache::gui {

using core::steady_ns;

core::Status DuplicateScan::start(const core::Store& store, std::vector<core::Ino> entries) {
    m_txn.reset();
    m_seen.clear();
    m_names.clear();
    m_name_ids.clear();
    m_groups.clear();
    m_next = 0;
    m_started = true;
    m_entries = std::move(entries);
    auto txn = KCACHE_TRY(store.read());
    m_txn_id = txn.id();
    m_txn = std::make_unique<core::Txn>(std::move(txn));
    return {};
}

core::Result<bool> DuplicateScan::step(std::int64_t budget_ns) {
    if (!m_txn) return done();
    const std::int64_t deadline = steady_ns() + budget_ns;
    do {
        if (m_next == m_entries.size()) {
            KCACHE_TRY(finish());
            return true;
        }
        const core::Ino entry = m_entries[m_next++];
        if (auto status = scan_entry(entry); !status) {
            m_txn.reset();
            return tl::unexpected(status.error());
        }
        // Checking the clock every entry costs more than the entry; every 64 is enough.
    } while ((m_next % 64 != 0) || steady_ns() < deadline);
    return false;
}

core::Status DuplicateScan::run_to_end() {
    while (true) {
        auto finished = KCACHE_TRY(step(1'000'000'000));
        if (finished) return {};
    }
}

core::Status DuplicateScan::scan_entry(core::Ino entry) {
    auto attr = m_txn->getattr(entry);
    if (!attr) {
        return attr.error().code == ENOENT ? core::Status{} : tl::unexpected(attr.error());
    }
    if (attr->is_dir()) return scan_dir(entry, entry);
    if (attr->is_regular()) {
        auto info = KCACHE_TRY(m_txn->entry(entry));
        const std::string_view name = info.name;
        note_binary(entry, name.substr(name.rfind('/') + 1), *attr);
    }
    return {};
}

core::Status DuplicateScan::scan_dir(core::Ino entry, core::Ino dir) {
    std::vector<core::Ino> subdirs;
    core::Status status = m_txn->readdir(dir, "", [&](const core::DirEntry& child) {
        if (child.name == "." || child.name == "..") return true;
        if (child.type == core::FileType::directory) {
            subdirs.push_back(child.ino);
        } else if (child.type == core::FileType::regular &&
                   core::role_of(child.name) == core::Role::binary) {
            auto attr = m_txn->getattr(child.ino);
            if (!attr) {
                status = tl::unexpected(attr.error());
                return false;
            }
            note_binary(entry, child.name, *attr);
        }
        return true;
    });
    if (!status) return status;
    for (core::Ino sub : subdirs) {
        if (status = scan_dir(entry, sub); !status) return status;
    }
    return {};
}

void DuplicateScan::note_binary(core::Ino entry, std::string_view name, const core::Attr& attr) {
    if (attr.digest.empty() || core::role_of(name) != core::Role::binary) return;
    auto [it, added] =
        m_name_ids.try_emplace(std::string(name), static_cast<std::uint32_t>(m_names.size()));
    if (added) m_names.emplace_back(name);
    m_seen.push_back({attr.digest, entry, attr.size, it->second});
}

core::Status DuplicateScan::finish() {
    auto before = [](const Seen& a, const Seen& b) {
        if (a.digest.high != b.digest.high) return a.digest.high < b.digest.high;
        if (a.digest.low != b.digest.low) return a.digest.low < b.digest.low;
        return a.entry < b.entry;
    };
    std::sort(m_seen.begin(), m_seen.end(), before);
    for (std::size_t i = 0; i < m_seen.size();) {
        std::size_t j = i + 1;
        while (j < m_seen.size() && m_seen[j].digest == m_seen[i].digest) ++j;
        DuplicateGroup group;
        for (std::size_t k = i; k < j; ++k) {
            // Two copies inside one entry are not a key problem: count entries once.
            if (group.entries.empty() || group.entries.back() != m_seen[k].entry) {
                group.entries.push_back(m_seen[k].entry);
            }
        }
        if (group.entries.size() >= 2) {
            group.digest = m_seen[i].digest;
            group.size = m_seen[i].size;
            group.file_name = m_names[m_seen[i].name];
            for (core::Ino ino : group.entries) {
                auto info = KCACHE_TRY(m_txn->entry(ino));
                group.keys.push_back(std::move(info.name));
            }
            m_groups.push_back(std::move(group));
        }
        i = j;
    }
    std::sort(m_groups.begin(), m_groups.end(),
              [](const DuplicateGroup& a, const DuplicateGroup& b) {
                  if (a.entries.size() != b.entries.size())
                      return a.entries.size() > b.entries.size();
                  if (a.wasted_bytes() != b.wasted_bytes())
                      return a.wasted_bytes() > b.wasted_bytes();
                  return a.keys.front() < b.keys.front();
              });
    m_seen = {};
    m_txn.reset();
    return {};
}

}  // namespace kcache::gui
