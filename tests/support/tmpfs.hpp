// A small tmpfs for tests that need a filesystem that fills up (root only; a test
// without the privilege skips, exit 77). Unmounted when the object goes.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "skip.hpp"

namespace kcache::test {

class Tmpfs {
  public:
    Tmpfs(const std::filesystem::path& where, const std::string& size) : m_path(where) {
        if (geteuid() != 0) skip("mounting a tmpfs needs root");
        std::filesystem::create_directories(m_path);
        const std::string options = "size=" + size;
        if (::mount("tmpfs", m_path.c_str(), "tmpfs", 0, options.c_str()) != 0) {
            skip("cannot mount a tmpfs: " + std::string(std::strerror(errno)));
        }
    }
    ~Tmpfs() { ::umount2(m_path.c_str(), MNT_DETACH); }
    Tmpfs(const Tmpfs&) = delete;
    Tmpfs& operator=(const Tmpfs&) = delete;
    const std::filesystem::path& path() const { return m_path; }

  private:
    std::filesystem::path m_path;
};

}  // namespace kcache::test
