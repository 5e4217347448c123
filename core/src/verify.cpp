// verify, garbage collection and compaction.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "kcache/core/holds.hpp"
#include "kcache/core/maintenance.hpp"
#include "store_impl.hpp"

namespace kcache::core {
namespace fs = std::filesystem;
using records::Inode;

namespace {

struct Totals {
    std::uint64_t files = 0, bytes = 0, stored = 0;
};

// One verify pass over a snapshot: what the steps of verify() find and count, in the
// order they run (each step reads what the ones before it counted).
class Verifier {
  public:
    Verifier(const Txn& txn, const ProgressFn& progress)
        : m_txn(txn), m_tx(TxnAccess::tx(txn)), m_progress(progress) {}

    Result<VerifyReport> run() {
        // 1. The tree: every inode is linked from its parent under its name, at the right
        //    depth and in the right entry; count references to blobs.
        KCACHE_TRY(read_inodes());
        for (const Inode& node : m_nodes) check_node(node);
        KCACHE_TRY(check_links());
        KCACHE_TRY(check_dirents());
        KCACHE_TRY(check_xattrs());
        KCACHE_TRY(count_holds());
        // 2. Blobs: content matches digest and size, refcounts match references (a
        //    segment list holds one per occurrence of a segment: counted first).
        KCACHE_TRY(read_lists());
        KCACHE_TRY(check_blobs());
        name_damage();
        check_chunks();
        // 2b. Kinds and dictionaries (schema 4).
        if (m_tx.db.has_dicts) KCACHE_TRY(check_dictionaries());
        // 3. Entries: accounting matches the tree; unpinned ones are in the LRU index.
        KCACHE_TRY(check_entries());
        // 4. Gauges match what is there.
        check_gauges();
        if (m_progress) m_progress(m_total_blobs, m_total_blobs);
        return std::move(m_report);
    }

  private:
    const Txn& m_txn;
    Tx m_tx;
    const ProgressFn& m_progress;
    VerifyReport m_report;
    // The tree.
    std::unordered_map<Digest, std::uint64_t, DigestHash> m_refs;
    std::unordered_map<Ino, Totals> m_per_entry;
    std::unordered_map<Ino, Inode> m_dirs;  // small: directories only
    Totals m_all;
    std::uint64_t m_dirents_expected = 0;
    std::vector<Inode> m_nodes;
    std::unordered_map<Ino, std::uint32_t> m_names;  // nodes with several: their nlink
    // The blobs.
    std::uint64_t m_total_blobs = 0;
    std::uint64_t m_blob_count = 0, m_stored_total = 0, m_raw_total = 0, m_chunks_expected = 0;
    std::map<std::uint32_t, records::Kind> m_kinds;  // recounted from the blobs
    std::map<std::uint32_t, std::uint64_t> m_dictionary_users;
    std::unordered_map<Digest, bool, DigestHash> m_damaged;  // blobs whose content is bad
    std::unordered_map<Digest, std::vector<Digest>, DigestHash> m_lists;  // segmented blobs
    std::uint64_t m_entry_count = 0;

    void problem(std::string text) {
        if (m_report.problems.size() < 1000) m_report.problems.push_back(std::move(text));
    }

    Status read_inodes() {
        return m_tx.scan(m_tx.db.inodes, {}, {}, [&](std::string_view key, std::string_view value) {
            const Ino ino = records::u64_from_key(key);
            auto node = records::decode_inode(ino, value);
            if (!node) {
                problem(fmt::format("inode {}: {}", ino, node.error().message));
                return true;
            }
            ++m_report.inodes;
            if (is_dir(node->mode)) m_dirs.emplace(ino, *node);
            m_nodes.push_back(std::move(*node));
            return true;
        });
    }

    void check_node(const Inode& node) {
        if (node.ino == kRootIno) return;
        const bool dir = is_dir(node.mode);
        m_dirents_expected += dir ? 1 : node.nlink;
        if (!dir && node.nlink != 1) m_names.emplace(node.ino, node.nlink);
        auto parent = m_dirs.find(node.parent);
        if (parent == m_dirs.end()) {
            problem(fmt::format("inode {} ('{}'): parent {} is not a directory", node.ino,
                                node.name, node.parent));
            return;
        }
        auto link = m_tx.child(node.parent, node.name);
        if (!link || !*link || (*link)->child != node.ino) {
            problem(
                fmt::format("inode {} ('{}'): not linked from its parent", node.ino, node.name));
        }
        if (node.depth != parent->second.depth + 1) {
            problem(fmt::format("inode {} ('{}'): depth {} under a parent at depth {}", node.ino,
                                node.name, node.depth, parent->second.depth));
        }
        // Inside an entry everything belongs to it; in a container a node is outside
        // every entry, an entry of its own (directory) or in its stem's entry (file).
        const Ino parent_entry = parent->second.entry;
        if (parent_entry && node.entry != parent_entry) {
            problem(fmt::format("inode {} ('{}'): in entry {}, expected {}", node.ino, node.name,
                                node.entry, parent_entry));
        } else if (node.entry && !m_tx.find_entry_record(node.entry).value_or(std::nullopt)) {
            problem(fmt::format("inode {} ('{}'): its entry {} has no record", node.ino, node.name,
                                node.entry));
        }
        if (is_regular(node.mode)) count_file(node);
    }

    // A regular file: its bytes, its blob reference, its entry's totals.
    void count_file(const Inode& node) {
        ++m_all.files;
        m_all.bytes += node.size;
        std::uint64_t stored = 0;
        if (!node.digest.empty()) {
            ++m_refs[node.digest];
            auto ref = m_tx.blob_ref(node.digest);
            if (ref && *ref) {
                stored = records::file_footprint(**ref);
                if ((*ref)->raw_size != node.size) {
                    problem(fmt::format("inode {} ('{}'): size {} but its blob holds {} bytes",
                                        node.ino, node.name, node.size, (*ref)->raw_size));
                }
            } else {
                problem(fmt::format("inode {} ('{}'): blob {} is missing", node.ino, node.name,
                                    node.digest.hex()));
            }
        } else if (node.size != 0) {
            problem(fmt::format("inode {} ('{}'): size {} with no content", node.ino, node.name,
                                node.size));
        }
        if (node.entry) {
            Totals& t = m_per_entry[node.entry];
            ++t.files;
            t.bytes += node.size;
            t.stored += stored;
        }
    }

    // Further names (schema 4): each one a dirent of the node, in its entry; nlink counts
    // them and the node's own name.
    Status check_links() {
        if (!m_tx.db.has_links) {
            if (!m_names.empty()) {
                problem(fmt::format("{} nodes with several names in a db without a links table",
                                    m_names.size()));
            }
            return {};
        }
        std::unordered_map<Ino, std::uint32_t> further;
        KCACHE_TRY(m_tx.scan(m_tx.db.links, {}, {}, [&](std::string_view key, std::string_view) {
            const Ino ino = records::u64_from_key(key);
            const records::LinkName name = records::decode_link_key(key);
            ++further[ino];
            check_link(ino, name);
            return true;
        }));
        for (const auto& [ino, nlink] : m_names) {
            if (further[ino] + 1 != nlink) {
                problem(
                    fmt::format("inode {}: nlink {} but {} names", ino, nlink, further[ino] + 1));
            }
        }
        return {};
    }

    void check_link(Ino ino, const records::LinkName& name) {
        const auto node = m_names.find(ino);
        auto link = m_tx.child(name.parent, name.name);
        if (node == m_names.end()) {
            problem(fmt::format("name '{}' in inode {}: of inode {}, which has one name", name.name,
                                name.parent, ino));
        } else if (!link || !*link || (*link)->child != ino) {
            problem(fmt::format("name '{}' in inode {}: not a directory entry of inode {}",
                                name.name, name.parent, ino));
        }
        const auto dir = m_dirs.find(name.parent);
        auto self = m_tx.inode(ino);
        if (dir != m_dirs.end() && self && dir->second.entry && dir->second.entry != self->entry) {
            problem(fmt::format("name '{}' in inode {}: in entry {}, its inode {} in entry {}",
                                name.name, name.parent, dir->second.entry, ino, self->entry));
        }
    }

    Status check_dirents() {
        std::uint64_t dirents = 0;
        KCACHE_TRY(m_tx.scan(m_tx.db.dirents, {}, {}, [&](std::string_view, std::string_view) {
            ++dirents;
            return true;
        }));
        if (dirents != m_dirents_expected) {
            problem(fmt::format("{} directory entries for {} linked inodes", dirents,
                                m_dirents_expected));
        }
        return {};
    }

    // Extended attributes (xattrs.hpp) go with their inode: a row of an inode that is
    // gone was left by a program that does not know the table (kcache gc removes it).
    Status check_xattrs() {
        if (!m_tx.db.has_xattrs) return {};
        Ino last_orphan = 0;
        return m_tx.scan(m_tx.db.xattrs, {}, {}, [&](std::string_view key, std::string_view) {
            const Ino ino = records::u64_from_key(key);
            if (ino != last_orphan &&
                !m_tx.get(m_tx.db.inodes, key.substr(0, 8)).value_or(std::nullopt)) {
                last_orphan = ino;
                problem(
                    fmt::format("extended attributes of inode {}, which does not exist "
                                "(kcache gc removes them)",
                                ino));
            }
            return true;
        });
    }

    // Holds (holds.hpp) are references too. One on a blob that is gone is damage:
    // the next fresh mount clears it.
    Status count_holds() {
        return for_each_hold(m_txn, [&](const Digest& digest, std::uint64_t count) {
            ++m_report.holds;
            if (!m_tx.blob_ref(digest).value_or(std::nullopt)) {
                problem(
                    fmt::format("hold on blob {}: no such blob (cleared at the next fresh mount)",
                                digest.hex()));
            } else {
                m_refs[digest] += count;
            }
            return true;
        });
    }

    // Segment lists, read first: each counts a reference per occurrence of a segment.
    Status read_lists() {
        return m_tx.scan(
            m_tx.db.blob_refs, {}, {}, [&](std::string_view key, std::string_view value) {
                auto ref = records::decode_blob_ref(value);
                if (!ref || ref->codec != records::Codec::segments) return true;
                const Digest digest = records::digest_from_key(key);
                auto list = ops::segment_list(m_tx, digest);
                if (!list || !*list) {
                    problem(fmt::format("blob {}: {}", digest.hex(),
                                        list ? "no segment list" : list.error().message));
                    m_damaged[digest] = true;
                    return true;
                }
                for (const Digest& seg : **list) ++m_refs[seg];
                m_lists.emplace(digest, std::move(**list));
                return true;
            });
    }

    Status check_blobs() {
        MDB_stat st{};
        mdb_stat(m_tx.txn, m_tx.db.blob_refs, &st);
        m_total_blobs = st.ms_entries;
        return m_tx.scan(
            m_tx.db.blob_refs, {}, {}, [&](std::string_view key, std::string_view value) {
                const Digest digest = records::digest_from_key(key);
                ++m_report.blobs;
                auto ref = records::decode_blob_ref(value);
                if (!ref) {
                    problem(fmt::format("blob {}: {}", digest.hex(), ref.error().message));
                    return true;
                }
                check_blob(digest, *ref);
                if (m_progress && m_report.blobs % 256 == 0)
                    m_progress(m_report.blobs, m_total_blobs);
                return true;
            });
    }

    void check_blob(const Digest& digest, const records::BlobRef& ref) {
        ++m_blob_count;
        m_chunks_expected += records::chunk_count(ref.stored_size);
        m_stored_total += records::footprint(ref);
        m_raw_total += records::raw_counted(ref);
        if (ref.kind) {
            records::Kind& k = m_kinds[ref.kind];
            ++k.blobs;
            k.raw_bytes += ref.raw_size;
            k.stored_bytes += records::footprint(ref);
        }
        if (ref.dictionary) ++m_dictionary_users[ref.dictionary];
        const auto it = m_refs.find(digest);
        const std::uint64_t counted = it == m_refs.end() ? 0 : it->second;
        if (ref.refcount != counted) {
            problem(fmt::format("blob {}: refcount {} but {} files refer to it", digest.hex(),
                                ref.refcount, counted));
        }
        if (ref.codec == records::Codec::segments) {
            // Its segments are blobs checked on their own: check the list and sizes.
            const auto list = m_lists.find(digest);
            if (list != m_lists.end()) check_list(digest, ref, list->second);
        } else if (auto content = ops::read_blob(m_tx, digest, ref.raw_size); !content) {
            problem(fmt::format("blob {}: {}", digest.hex(), content.error().message));
            m_damaged[digest] = true;
        } else if (!ops::is_flat_address(digest, {content->bytes()}) &&
                   !(digest_of(content->bytes()) == digest)) {
            // A flat blob's address is the flat digest of its bytes (a big file stored
            // before schema 3 kept its flat digest too) or an alternative address.
            problem(fmt::format("blob {}: content does not match its digest", digest.hex()));
            m_damaged[digest] = true;
        }
    }

    // A segmented blob: its digest is its list's (or, after a collision, an alternative
    // address of the list: store_impl.hpp), its size the list's span, and each segment a
    // stored blob (never a list) of its share of the size.
    void check_list(const Digest& digest, const records::BlobRef& ref,
                    const std::vector<Digest>& list) {
        if (!ops::is_list_address(digest, list)) {
            problem(fmt::format("blob {}: segment list does not match its digest", digest.hex()));
            m_damaged[digest] = true;
            return;
        }
        for (std::size_t i = 0; i < list.size(); ++i) {
            const std::uint64_t size =
                std::min<std::uint64_t>(kSegmentSize, ref.raw_size - i * kSegmentSize);
            auto seg = m_tx.blob_ref(list[i]);
            if (!seg || !*seg || (*seg)->raw_size != size ||
                (*seg)->codec == records::Codec::segments) {
                problem(fmt::format("blob {}: segment {} ({}) is missing or not {} bytes",
                                    digest.hex(), i, list[i].hex(), size));
                m_damaged[digest] = true;
                return;
            }
        }
    }

    // A damaged segment damages every list holding it; each file a damaged blob breaks
    // is named, so a person knows which entries to evict.
    void name_damage() {
        for (const auto& [digest, list] : m_lists) {
            for (const Digest& seg : list) {
                if (m_damaged.count(seg)) m_damaged[digest] = true;
            }
        }
        for (const Inode& node : m_nodes) {
            if (node.digest.empty() || !m_damaged.count(node.digest)) continue;
            auto path = m_tx.path_of(node.ino);
            problem(fmt::format("file '{}' has damaged content (blob {})", path ? *path : node.name,
                                node.digest.hex()));
        }
    }

    void check_chunks() {
        MDB_stat st{};
        mdb_stat(m_tx.txn, m_tx.db.blob_data, &st);
        if (st.ms_entries != m_chunks_expected) {
            problem(fmt::format("{} blob chunks stored where the blob references need {}",
                                st.ms_entries, m_chunks_expected));
        }
    }

    // Each kind's accounting matches its blobs, each dictionary's users the blobs
    // compressed with it, and every dictionary a blob names is there (a blob that could
    // not be read was reported above).
    Status check_dictionaries() {
        std::map<std::uint32_t, records::Dictionary> dictionaries;
        KCACHE_TRY(
            m_tx.scan(m_tx.db.dicts, {}, {}, [&](std::string_view key, std::string_view value) {
                const auto id = ByteReader(key, "dicts key").be_at<std::uint32_t>(1).value_or(0);
                if (key.starts_with("K")) {
                    check_kind(id, value);
                } else if (key.starts_with("D")) {
                    auto d = records::decode_dictionary(value);
                    if (!d) {
                        problem(fmt::format("dictionary {}: {}", id, d.error().message));
                        return true;
                    }
                    dictionaries.emplace(id, *d);
                }
                return true;
            }));
        for (const auto& [id, k] : m_kinds) {
            problem(fmt::format("{} blobs are of kind {}, which has no record", k.blobs, id));
        }
        for (const auto& [id, users] : m_dictionary_users) {
            auto d = dictionaries.find(id);
            if (d == dictionaries.end()) {
                problem(fmt::format("dictionary {} is missing ({} blobs use it)", id, users));
            } else if (d->second.users != users) {
                problem(fmt::format("dictionary {}: records {} users, {} blobs use it", id,
                                    d->second.users, users));
            }
        }
        return {};
    }

    // Kind `id`'s record against the blobs counted of it (which it then leaves: a kind
    // left over has blobs but no record).
    void check_kind(std::uint32_t id, std::string_view value) {
        auto k = records::decode_kind(value);
        if (!k) {
            problem(fmt::format("kind {}: {}", id, k.error().message));
            return;
        }
        const records::Kind& counted = m_kinds[id];
        if (k->blobs != counted.blobs || k->raw_bytes != counted.raw_bytes ||
            k->stored_bytes != counted.stored_bytes) {
            problem(
                fmt::format("kind '{}': records {} blobs/{} raw/{} stored, its blobs "
                            "are {}/{}/{}",
                            k->name, k->blobs, k->raw_bytes, k->stored_bytes, counted.blobs,
                            counted.raw_bytes, counted.stored_bytes));
        }
        m_kinds.erase(id);
        if (k->dictionary) m_dictionary_users.try_emplace(k->dictionary, 0);
    }

    Status check_entries() {
        return m_tx.scan(m_tx.db.entries, {}, {},
                         [&](std::string_view key, std::string_view value) {
                             const Ino ino = records::u64_from_key(key);
                             auto entry = records::decode_entry(ino, value);
                             ++m_report.entries;
                             if (!entry) {
                                 problem(fmt::format("entry {}: {}", ino, entry.error().message));
                                 return true;
                             }
                             ++m_entry_count;
                             check_entry(ino, *entry);
                             return true;
                         });
    }

    void check_entry(Ino ino, const EntryInfo& entry) {
        const Totals t = m_per_entry[ino];
        if (entry.files != t.files || entry.bytes != t.bytes || entry.stored_bytes != t.stored) {
            problem(fmt::format(
                "entry '{}': records {} files/{} bytes/{} stored, tree has {}/{}/{}", entry.name,
                entry.files, entry.bytes, entry.stored_bytes, t.files, t.bytes, t.stored));
        }
        if (entry.kind == EntryKind::node) {
            auto node = m_tx.inode(ino);
            if (!node || node->entry != ino)
                problem(fmt::format("entry '{}': its node is missing", entry.name));
        } else {
            auto id = ops::find_stem_entry(m_tx, entry.parent, entry.stem);
            if (!id || !*id || **id != ino)
                problem(fmt::format("entry '{}': missing from the stem index", entry.name));
        }
        if (!entry.pinned) {
            auto lru = m_tx.get(m_tx.db.lru, records::lru_key(entry.last_access_ns, ino));
            if (!lru || !*lru)
                problem(fmt::format("entry '{}': missing from the LRU index", entry.name));
        }
    }

    void check_gauges() {
        auto gauge = [&](Counter c, std::uint64_t actual) {
            auto value = m_tx.counter(c);
            if (value && *value != actual) {
                problem(fmt::format("statistic {} is {} but the db holds {}", counter_name(c),
                                    *value, actual));
            }
        };
        gauge(Counter::entries, m_entry_count);
        gauge(Counter::files, m_all.files);
        gauge(Counter::bytes, m_all.bytes);
        gauge(Counter::blobs, m_blob_count);
        gauge(Counter::stored_bytes, m_stored_total);
        gauge(Counter::blob_raw_bytes, m_raw_total);
    }
};

}  // namespace

Result<VerifyReport> verify(const Store& store, const ProgressFn& progress) {
    auto txn = KCACHE_TRY(store.read());
    return Verifier(txn, progress).run();
}

Result<GcReport> collect_garbage(Store& store) {
    GcReport report;
    auto readers = KCACHE_TRY(store.clear_stale_readers());
    report.stale_readers = readers;
    KCACHE_TRY(store.update([&](WriteTxn& txn) -> Status {
        Tx tx = TxnAccess::tx(txn);
        std::vector<std::string> dead;
        auto scanned = tx.scan(tx.db.leases, {}, {}, [&](std::string_view key, std::string_view) {
            std::uint32_t pid = 0;
            for (char c : key.substr(8, 4)) pid = (pid << 8) | static_cast<unsigned char>(c);
            const bool alive =
                pid != 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
            if (!alive || key.size() != 12) dead.emplace_back(key);
            return true;
        });
        if (!scanned) return scanned;
        for (const auto& key : dead) {
            if (auto d = tx.del(tx.db.leases, key); !d) return d;
        }
        report.stale_leases = dead.size();
        // Extended attributes of inodes that are gone (verify names them).
        if (tx.db.has_xattrs) {
            std::vector<std::string> orphans;
            auto xattrs =
                tx.scan(tx.db.xattrs, {}, {}, [&](std::string_view key, std::string_view) {
                    if (!tx.get(tx.db.inodes, key.substr(0, 8)).value_or(std::nullopt))
                        orphans.emplace_back(key);
                    return true;
                });
            if (!xattrs) return xattrs;
            for (const auto& key : orphans) {
                if (auto d = tx.del(tx.db.xattrs, key); !d) return d;
            }
        }
        return {};
    }));
    auto recompressed = KCACHE_TRY(recompress_blobs(store));
    report.dictionaries = std::move(recompressed);
    auto txn = KCACHE_TRY(store.read());
    Tx tx = TxnAccess::tx(txn);
    // The free list (dbi 0): each record lists free page numbers, count first.
    KCACHE_TRY(tx.scan(0, {}, {}, [&](std::string_view, std::string_view value) {
        if (value.size() >= sizeof(std::size_t)) {
            std::size_t n = 0;
            std::memcpy(&n, value.data(), sizeof n);
            report.free_pages += n;
        }
        return true;
    }));
    report.file_bytes = store.data_file_bytes();
    return report;
}

Result<CompactReport> compact(const std::string& db_path) {
    const std::string lock_path = db_path + "/kcache.lock";
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return fail(errno, fmt::format("no kcache db at {}: {}", db_path, std::strerror(errno)));
    struct Closer {
        int fd;
        ~Closer() { close(fd); }
    } closer{fd};
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        return fail(
            EBUSY,
            fmt::format(
                "db {}: in use by another process (stop the daemon and other tools to compact)",
                db_path));
    }
    CompactReport report;
    std::error_code ec;
    report.bytes_before = fs::file_size(db_path + "/data.mdb", ec);
    const std::string tmp_dir = db_path + "/compact.tmp";
    fs::remove_all(tmp_dir, ec);
    fs::create_directory(tmp_dir, ec);
    if (ec) return fail(ec.value(), fmt::format("{}: {}", tmp_dir, ec.message()));
    MDB_env* env = nullptr;
    mdb_env_create(&env);
    mdb_env_set_maxdbs(env, 32);
    mdb_env_set_mapsize(env, kDefaultMapSize);
    int rc = mdb_env_open(env, db_path.c_str(), MDB_NOTLS | MDB_RDONLY, 0644);
    if (rc == 0) rc = mdb_env_copy2(env, tmp_dir.c_str(), MDB_CP_COMPACT);
    mdb_env_close(env);
    if (rc != 0) {
        fs::remove_all(tmp_dir, ec);
        return tl::unexpected(lmdb::error(rc, fmt::format("db {}: compact", db_path)));
    }
    fs::rename(tmp_dir + "/data.mdb", db_path + "/data.mdb", ec);
    if (ec)
        return fail(ec.value(),
                    fmt::format("db {}: replacing data.mdb: {}", db_path, ec.message()));
    fs::remove_all(tmp_dir, ec);
    report.bytes_after = fs::file_size(db_path + "/data.mdb", ec);
    return report;
}

}  // namespace kcache::core
