// The serving daemon (main.cpp): opens the db and serves the mount until it is stopped
// or hands it over to a successor (keeper.hpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "keeper.hpp"
#include "options.hpp"
#include "startup.hpp"

namespace kcache::fsd {

// libfuse's arguments for the session (and the keeper's mount).
std::vector<std::string> fuse_arguments(const Options& options);

// Opens the db and serves the mount: mounted here (--no-keeper), or the keeper's
// (`inherited`), which this daemon may take over from one that died. Start-up errors
// end the process through `startup`; returns the exit status (keeper::kHandedOver after
// an upgrade handed the mount over).
int serve(const Options& options, const std::string& mountpoint, StartupPipe& startup,
          const std::optional<keeper::Inherited>& inherited);

}  // namespace kcache::fsd
