// Exporting entries to a bundle (bundle_format.hpp): written to a temporary file,
// synced, then renamed into place.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "bundle_format.hpp"
#include "kcache/core/bundle.hpp"

namespace kcache::core {
using namespace bundle;
using records::Codec;

namespace {

class BundleWriter {
  public:
    BundleWriter(std::FILE* out, std::string path) : m_out(out), m_path(std::move(path)) {}
    Status put(std::string_view bytes) {
        if (bytes.empty()) return {};  // (an empty view may have no data pointer at all)
        m_hash.update(bytes.data(), bytes.size());
        if (std::fwrite(bytes.data(), 1, bytes.size(), m_out) != bytes.size()) {
            return fail(errno ? errno : EIO,
                        fmt::format("{}: write failed: {}", m_path, std::strerror(errno)));
        }
        m_written += bytes.size();
        return {};
    }
    Status finish(std::uint64_t entries, std::uint64_t nodes) {
        std::string trailer;
        records::Writer w(trailer);
        w.u8('Z');
        w.u64(entries);
        w.u64(nodes);
        if (auto s = put(trailer); !s) return s;
        const Digest d = m_hash.digest();
        std::string sum;
        records::Writer(sum).u64(d.high);
        records::Writer(sum).u64(d.low);
        if (std::fwrite(sum.data(), 1, sum.size(), m_out) != sum.size()) {
            return fail(errno ? errno : EIO,
                        fmt::format("{}: write failed: {}", m_path, std::strerror(errno)));
        }
        m_written += sum.size();
        return {};
    }
    std::uint64_t written() const { return m_written; }

  private:
    std::FILE* m_out;
    std::string m_path;
    HashState m_hash;
    std::uint64_t m_written = 0;
};

// Writes one node record and, for a directory, pushes its children.
Status export_node(const Tx& tx, BundleWriter& out, Ino ino, const std::string& path,
                   ExportReport& report) {
    auto node = KCACHE_TRY(tx.inode(ino));
    if (path.size() > kMaxBundlePath) {  // str16 would truncate its length
        return fail(ENAMETOOLONG,
                    fmt::format("'{}...': path too long for a bundle", path.substr(0, 64)));
    }
    std::string rec;
    records::Writer w(rec);
    w.u8('N');
    w.str16(path);
    const Attr attr = node.attr();
    w.u8(static_cast<std::uint8_t>(attr.type()));
    w.u32(node.mode);
    w.i64(node.mtime_ns);
    if (attr.is_regular()) {
        Content stored_content;
        Codec codec = Codec::raw;
        if (!node.digest.empty()) {
            auto r = KCACHE_TRY(tx.blob_ref(node.digest));
            if (!r) return fail(EIO, fmt::format("blob of '{}' is missing", path));
            codec = r->codec;
            if (codec == Codec::segments || r->dictionary != 0) {
                // Segments stay in the db: the bundle carries the content, compressed
                // whole when that saves space. So do dictionaries: a bundle is read
                // where they are not, so its frames name none.
                auto raw = ops::read_blob(tx, node.digest, node.size);
                if (!raw) return tl::unexpected(with_context(raw.error(), path));
                std::string compressed = ops::compressed_form(raw->bytes());
                codec = compressed.empty() ? Codec::raw : Codec::zstd;
                stored_content =
                    compressed.empty() ? std::move(*raw) : Content::owned(std::move(compressed));
            } else {
                auto data = ops::stored_form(tx, node.digest, *r);
                if (!data) return tl::unexpected(with_context(data.error(), path));
                stored_content = std::move(*data);
            }
        }
        const std::string_view stored = stored_content.bytes();
        w.u64(node.size);
        w.u64(node.digest.high);
        w.u64(node.digest.low);
        w.u8(static_cast<std::uint8_t>(codec));
        w.u32(static_cast<std::uint32_t>(stored.size()));
        if (auto s = out.put(rec); !s) return s;
        if (auto s = out.put(stored); !s) return s;  // no copy of the content
        ++report.files;
        report.bytes += node.size;
        return {};
    }
    if (attr.is_symlink()) w.str16(node.target);
    return out.put(rec);
}

Status export_entry(const Tx& tx, BundleWriter& out, const EntryInfo& entry, ExportReport& report,
                    std::uint64_t& nodes) {
    std::string rec;
    records::Writer w(rec);
    w.u8('E');
    w.str16(entry.name);
    w.u8(static_cast<std::uint8_t>(entry.kind));
    if (auto s = out.put(rec); !s) return s;
    const auto slash = entry.name.rfind('/');
    const std::string dir =
        slash == std::string::npos ? std::string() : entry.name.substr(0, slash + 1);
    std::vector<std::pair<Ino, std::string>> work;
    auto listed = ops::for_each_member(tx, entry, [&](const records::Inode& member) {
        work.emplace_back(member.ino,
                          entry.kind == EntryKind::node ? entry.name : dir + member.name);
        return true;
    });
    if (!listed) return listed;
    std::reverse(work.begin(), work.end());  // name order on pop
    while (!work.empty()) {
        auto [ino, path] = std::move(work.back());
        work.pop_back();
        if (auto s = export_node(tx, out, ino, path, report); !s) return s;
        ++nodes;
        auto children = KCACHE_TRY(tx.children(ino));
        for (auto it = children.rbegin(); it != children.rend(); ++it) {  // name order on pop
            work.emplace_back(it->second.child, path + "/" + it->first);
        }
    }
    return {};
}

}  // namespace

Result<ExportReport> export_bundle(const Store& store, const std::vector<std::string>& names,
                                   const std::string& out_path, const ProgressFn& progress) {
    auto txn = KCACHE_TRY(store.read());
    std::vector<EntryInfo> selected;
    if (names.empty()) {
        KCACHE_TRY(txn.for_each_entry([&](const EntryInfo& e) {
            selected.push_back(e);
            return true;
        }));
    } else {
        for (const auto& name : names) {
            auto e = txn.find_entry(name);
            if (!e) return tl::unexpected(with_context(e.error(), "export"));
            selected.push_back(std::move(*e));
        }
    }
    const std::string tmp = fmt::format("{}.tmp.{}", out_path, getpid());
    File out(std::fopen(tmp.c_str(), "wb"));
    if (!out) return fail(errno, fmt::format("{}: {}", out_path, std::strerror(errno)));
    auto cleanup = [&](Error e) {
        out.reset();
        std::remove(tmp.c_str());
        return tl::unexpected(std::move(e));
    };
    BundleWriter writer(out.get(), out_path);
    std::string header(kMagic);
    records::Writer(header).u32(kFormat);
    if (auto s = writer.put(header); !s) return cleanup(s.error());
    ExportReport report;
    std::uint64_t nodes = 0;
    Tx tx = TxnAccess::tx(txn);
    for (const auto& entry : selected) {
        if (auto s = export_entry(tx, writer, entry, report, nodes); !s) return cleanup(s.error());
        ++report.entries;
        if (progress) progress(report.entries, selected.size());
    }
    if (auto s = writer.finish(report.entries, nodes); !s) return cleanup(s.error());
    if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0) {
        return cleanup({errno, fmt::format("{}: {}", out_path, std::strerror(errno))});
    }
    out.reset();
    if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
        return cleanup({errno, fmt::format("{}: {}", out_path, std::strerror(errno))});
    }
    report.bundle_bytes = writer.written();
    return report;
}

}  // namespace kcache::core
