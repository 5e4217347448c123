#include "kcache/core/error.hpp"

namespace kcache::core {

Error with_context(Error error, const std::string& context) {
    error.message = context + ": " + error.message;
    return error;
}

}  // namespace kcache::core
