// The one table that says what a cache file is, from its name.
#pragma once

#include <string_view>

#include "kcache/core/types.hpp"

namespace kcache::core {

// binary: .cubin .fatbin .hsaco .vmfb .so .o .bin ...; signature: .json kernel_sig ...;
// ir: .ptx .mlir .ll .llir .ttir .ttgir .source ...; other: anything else.
Role role_of(std::string_view file_name);
// The file's kind, from the same table: its suffix without the dot ("cubin", "ptx",
// "json", "ttir", ...), "group" for Triton's group files, "other" for the rest.
// Files of one kind from one producer are alike (dictionaries.hpp).
std::string_view file_kind(std::string_view file_name);
// Whether an entry is whole, from its files' names, for compilers that write an entry's
// files seconds apart and write one of them last (the shared tier keeps an entry's first
// upload, so it must not go early; fsd/src/tier/remote_tier.hpp):
//  - Triton: each stage's file as the stage ends, its group file (__grp__<name>.json,
//    put_group, once the files it lists are in place) last;
//  - Inductor's C++ kernels: <stem>.cpp, then the <stem>.so g++ builds from it, which
//    takes seconds.
// add() each file name of the entry; `expects_mark`: its compiler writes such a last
// file; `marked`: it is there. Other entries expect nothing.
struct Completion {
    bool expects_mark = false;
    bool marked = false;
    void add(std::string_view file_name);

  private:
    bool m_cpp = false, m_so = false;
};
// A guess from one file name of the entry, unknown when the name says nothing.
Producer producer_of(std::string_view file_name);

std::string_view role_name(Role r);
std::string_view producer_name(Producer p);

}  // namespace kcache::core
