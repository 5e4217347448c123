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
// True for a file its compiler writes after every other file of its entry, so an entry
// holding it is complete: Triton's group file (__grp__<name>.json, written by put_group
// once the files it lists are in place). Other compilers write no such marker.
bool completes_entry(std::string_view file_name);
// A guess from one file name of the entry, unknown when the name says nothing.
Producer producer_of(std::string_view file_name);

std::string_view role_name(Role r);
std::string_view producer_name(Producer p);

}  // namespace kcache::core
