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

// The stored form of a file's content, as a bundle carries it: compressed as stored, or,
// for segmented contents and frames that name a dictionary, read whole and compressed
// (segments and dictionaries stay in the db; a bundle is read where they are not). With
// it the content's digest_of, which the bundle carries (bundle_format.hpp): the file's
// digest is its blob's address, another one after an XXH3 collision (store_impl.hpp).
struct BundleForm {
    Content content;
    Codec codec = Codec::raw;
    Digest digest;
};
Result<BundleForm> bundle_form(const Tx& tx, const ImageFile& f, const std::string& path) {
    if (f.digest.empty()) return BundleForm{};
    auto r = KCACHE_TRY(tx.blob_ref(f.digest));
    if (!r) return fail(EIO, fmt::format("blob of '{}' is missing", path));
    // Read (and so checked against its digest, kcache/core/integrity.hpp) before its
    // stored form goes out: a bundle never carries damaged content.
    auto raw = ops::read_blob(tx, f.digest, f.size);
    if (!raw) return tl::unexpected(with_context(raw.error(), path));
    const Digest digest = digest_of(raw->bytes());
    if (r->codec == Codec::segments || r->dictionary != 0) {
        std::string compressed = ops::compressed_form(raw->bytes());
        if (compressed.empty()) return BundleForm{std::move(*raw), Codec::raw, digest};
        return BundleForm{Content::owned(std::move(compressed)), Codec::zstd, digest};
    }
    // Raw content is its stored form already.
    if (r->codec == Codec::raw) return BundleForm{std::move(*raw), Codec::raw, digest};
    auto data = ops::stored_form(tx, f.digest, *r);
    if (!data) return tl::unexpected(with_context(data.error(), path));
    return BundleForm{std::move(*data), r->codec, digest};
}

// Writes one node record: `path` from the root, then what its type carries.
Status export_node(const Tx& tx, BundleWriter& out, const ImageFile& f, const std::string& path,
                   ExportReport& report) {
    if (path.size() > kMaxBundlePath) {  // str16 would truncate its length
        return fail(ENAMETOOLONG,
                    fmt::format("'{}...': path too long for a bundle", path.substr(0, 64)));
    }
    std::string rec;
    records::Writer w(rec);
    w.u8('N');
    w.str16(path);
    w.u8(static_cast<std::uint8_t>(f.type));
    w.u32(f.mode);
    w.i64(f.mtime_ns);
    if (f.type == FileType::regular) {
        auto [content, codec, digest] = KCACHE_TRY(bundle_form(tx, f, path));
        const std::string_view stored = content.bytes();
        w.u64(f.size);
        w.u64(digest.high);
        w.u64(digest.low);
        w.u8(static_cast<std::uint8_t>(codec));
        w.u32(static_cast<std::uint32_t>(stored.size()));
        if (auto s = out.put(rec); !s) return s;
        if (auto s = out.put(stored); !s) return s;  // no copy of the content
        ++report.files;
        report.bytes += f.size;
        return {};
    }
    if (f.type == FileType::symlink) w.str16(f.target);
    return out.put(rec);
}

// An entry's record, its own node (a node entry's directory), then its image's files.
Status export_entry(const Txn& txn, BundleWriter& out, const EntryInfo& entry, ExportReport& report,
                    std::uint64_t& nodes) {
    const EntryImage image = KCACHE_TRY(read_image(txn, entry, false));
    std::string rec;
    records::Writer w(rec);
    w.u8('E');
    w.str16(entry.name);
    w.u8(static_cast<std::uint8_t>(entry.kind));
    if (auto s = out.put(rec); !s) return s;
    const Tx tx = TxnAccess::tx(txn);
    if (entry.kind == EntryKind::node && !image.single) {
        ImageFile own;
        own.type = FileType::directory;
        own.mode = image.dir_mode;
        own.mtime_ns = image.dir_mtime_ns.value_or(0);
        if (auto s = export_node(tx, out, own, entry.name, report); !s) return s;
        ++nodes;
    }
    for (const ImageFile& f : image.files) {
        if (auto s = export_node(tx, out, f, image_path(image, f), report); !s) return s;
        ++nodes;
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
    for (const auto& entry : selected) {
        if (auto s = export_entry(txn, writer, entry, report, nodes); !s) return cleanup(s.error());
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
