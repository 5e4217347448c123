// hiredis's replies into our own (client.hpp), kept apart from the connection so that
// the fuzz targets of reply parsers link without the rest of kcache_remote.
#include <cerrno>
#include <memory>

#include <fmt/core.h>
#include <hiredis/hiredis.h>

#include "client.hpp"

namespace kcache::remote {

Reply reply_of(const redisReply* r, std::uint64_t* received) {
    Reply out;
    switch (r->type) {
        case REDIS_REPLY_STRING:
            out.type = Reply::Type::string;
            break;
        case REDIS_REPLY_ARRAY:
            out.type = Reply::Type::array;
            break;
        case REDIS_REPLY_INTEGER:
            out.type = Reply::Type::integer;
            break;
        case REDIS_REPLY_STATUS:
            out.type = Reply::Type::status;
            break;
        case REDIS_REPLY_ERROR:
            out.type = Reply::Type::error;
            break;
        default:
            out.type = Reply::Type::nil;
            break;
    }
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
        r->type == REDIS_REPLY_ERROR) {
        out.str.assign(r->str, r->len);
        if (received) *received += r->len;
    }
    if (r->type == REDIS_REPLY_INTEGER) out.integer = r->integer;
    if (r->type == REDIS_REPLY_ARRAY) {
        out.elements.reserve(r->elements);
        for (std::size_t i = 0; i < r->elements; ++i)
            out.elements.push_back(reply_of(r->element[i], received));
    }
    return out;
}

Result<std::vector<Reply>> parse_replies(std::string_view bytes) {
    std::unique_ptr<redisReader, void (*)(redisReader*)> reader(redisReaderCreate(),
                                                                redisReaderFree);
    if (!reader) return core::fail(ENOMEM, "cannot allocate a reply reader");
    if (redisReaderFeed(reader.get(), bytes.data(), bytes.size()) != REDIS_OK)
        return core::fail(EPROTO, fmt::format("bad reply: {}", reader->errstr));
    std::vector<Reply> out;
    for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK)
            return core::fail(EPROTO, fmt::format("bad reply: {}", reader->errstr));
        if (raw == nullptr) return out;
        out.push_back(reply_of(static_cast<redisReply*>(raw), nullptr));
        freeReplyObject(raw);
    }
}

}  // namespace kcache::remote
