// hiredis's replies into our own (client.hpp), kept apart from the connection so that
// the fuzz targets of reply parsers link without the rest of kcache_remote.
#include <cerrno>
#include <memory>

#include <fmt/core.h>
#include <hiredis/hiredis.h>

#include "client.hpp"

namespace kcache::remote {

namespace {

// hiredis 0.14 allocates an array's element table as soon as it reads the array's
// header, and stores a count below -1 as a huge size: "*400000000" from a broken or
// hostile peer would allocate 3 GB, "*-5" would make an array that claims 2^64 - 5
// elements (tests/remote/fuzz_cluster.cpp found the first). Our table refuses both
// (the reader then fails with an error, EPROTO to our callers) and hands the rest to
// hiredis's own functions.
constexpr int kMaxElements = 1 << 20;  // CLUSTER SLOTS has at most 16384; a job set's SMEMBERS
const redisReplyObjectFunctions* g_hiredis = nullptr;  // hiredis's defaults, set once

void* create_array(const redisReadTask* task, int elements) {
    if (elements < 0 || elements > kMaxElements) return nullptr;
    return g_hiredis->createArray(task, elements);
}
void* create_string(const redisReadTask* task, char* str, size_t len) {
    return g_hiredis->createString(task, str, len);
}
void* create_integer(const redisReadTask* task, long long value) {
    return g_hiredis->createInteger(task, value);
}
void* create_nil(const redisReadTask* task) {
    return g_hiredis->createNil(task);
}
void free_object(void* reply) {
    g_hiredis->freeObject(reply);
}

}  // namespace

void limit_replies(redisReader* reader) {
    static redisReplyObjectFunctions bounded = [&] {
        g_hiredis = reader->fn;  // hiredis's static defaults, the same for every reader
        return redisReplyObjectFunctions{create_string, create_array, create_integer, create_nil,
                                         free_object};
    }();
    reader->fn = &bounded;
}

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
    limit_replies(reader.get());
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
