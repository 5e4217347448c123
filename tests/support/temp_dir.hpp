// Test fixtures: a private temporary directory, removed with everything in it.
#pragma once

#include <filesystem>
#include <string>

namespace kcache::test {

class TempDir {
  public:
    TempDir();  // mkdtemp under $TMPDIR (or /tmp)
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return m_path; }
    std::string str() const { return m_path.string(); }
    std::filesystem::path operator/(const std::string& name) const { return m_path / name; }

  private:
    std::filesystem::path m_path;
};

// Reads or writes a whole file (throws on failure: a test setup error).
std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);

}  // namespace kcache::test
