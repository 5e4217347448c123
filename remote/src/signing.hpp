// The trust policy of signed entries, shared by a pull (pull.cpp) and a signed push
// (transfer.cpp), internal to kcache_remote.
#pragma once

#include <string>
#include <string_view>

#include "kcache/remote/remote.hpp"
#include "kcache/remote/trust.hpp"
#include "protocol.hpp"

namespace kcache::remote {

// The trust policy for a decoded, checked manifest read under `ns` (docs/operations.md,
// "Trust model"): Rejection::none to go on (then `signer` is the key's id when signed).
// With a trust file: unsigned, untrusted and revoked keys are refused, then the
// signature must hold for this namespace and name. Without one: an unsigned entry is
// taken (the insecure default), a signed one must still hold for its own key. `detail`
// says why when refused.
Rejection check_signature(const proto::Manifest& m, std::string_view ns, const TrustFile* trust,
                          std::string& detail, std::string& signer);

}  // namespace kcache::remote
