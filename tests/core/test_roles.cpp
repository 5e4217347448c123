// The role and producer table: what a cache file is, from its name.
#include <set>
#include <string>

#include "core_test_util.hpp"
#include "kcache/core/roles.hpp"

using namespace kcache;
using core::Producer;
using core::producer_of;
using core::Role;
using core::role_of;

namespace Catch {
template <>
struct StringMaker<Role> {
    static std::string convert(Role r) { return std::string(core::role_name(r)); }
};
template <>
struct StringMaker<Producer> {
    static std::string convert(Producer p) { return std::string(core::producer_name(p)); }
};
}  // namespace Catch

TEST_CASE("roles: binaries by extension", "[roles]") {
    for (const char* name : {"add_kernel.cubin", "kernel.fatbin", "matmul.hsaco", "module.vmfb",
                             "launcher.so", "__triton_launcher.so", "obj.o"}) {
        INFO(name);
        CHECK(role_of(name) == Role::binary);
    }
}

TEST_CASE("roles: signatures", "[roles]") {
    for (const char* name : {"add_kernel.json", "kernel.json", "kernel_sig"}) {
        INFO(name);
        CHECK(role_of(name) == Role::signature);
    }
}

TEST_CASE("roles: intermediate representations", "[roles]") {
    for (const char* name : {"add_kernel.ptx", "kernel.mlir", "kernel.ll", "add_kernel.llir",
                             "add_kernel.ttir", "add_kernel.ttgir", "kernel.source"}) {
        INFO(name);
        CHECK(role_of(name) == Role::ir);
    }
}

TEST_CASE("roles: Triton group files are not signatures", "[roles]") {
    // __grp__<name>.json lists the files of a Triton kernel; a loader picking the
    // signature by role must not take it for the kernel's metadata.
    CHECK(role_of("__grp__add_kernel.json") == Role::other);
    CHECK(producer_of("__grp__add_kernel.json") == Producer::triton);
}

TEST_CASE("roles: Triton's group file, written last, completes its entry", "[roles]") {
    auto completion = [](std::initializer_list<const char*> names) {
        core::Completion c;
        for (const char* n : names) c.add(n);
        return std::pair{c.expects_mark, c.marked};
    };
    CHECK(completion({"add_kernel.ttir", "add_kernel.cubin"}) == std::pair{true, false});
    CHECK(completion({"add_kernel.cubin", "__grp__add_kernel.json"}) == std::pair{true, true});
    for (const char* name : {"add_kernel.json", "add_kernel.cubin", "grp.json", "", "__grp_"}) {
        INFO("'" << name << "'");
        CHECK_FALSE(completion({name}).second);
    }
    // Inductor's C++ kernel: its .cpp, then the .so g++ builds from it, seconds later.
    CHECK(completion({"cxyz.cpp"}) == std::pair{true, false});
    CHECK(completion({"cxyz.so", "cxyz.cpp"}) == std::pair{true, true});
    // Entries of one file, or a .py module, expect nothing.
    CHECK(completion({"cxyz.py"}) == std::pair{false, false});
    CHECK(completion({"cuda_utils.so"}) == std::pair{false, false});
}

TEST_CASE("roles: anything else is other", "[roles]") {
    for (const char* name :
         {"notes.txt", "", "cubin", "kernel.cubin.tmp", "lock", "Makefile", "json", ".json.bak"}) {
        INFO("'" << name << "'");
        CHECK(role_of(name) == Role::other);
    }
}

TEST_CASE("roles: producers guessed from Triton and Wave names", "[roles]") {
    CHECK(producer_of("add_kernel.ttir") == Producer::triton);
    CHECK(producer_of("add_kernel.ttgir") == Producer::triton);
    CHECK(producer_of("add_kernel.llir") == Producer::triton);
    CHECK(producer_of("add_kernel.source") == Producer::triton);
    CHECK(producer_of("module.vmfb") == Producer::wave);
    CHECK(producer_of("notes.txt") == Producer::unknown);
    CHECK(producer_of("") == Producer::unknown);
}

TEST_CASE("roles: an entry's producer comes from its files' names", "[roles][entries]") {
    kcache::test::TestStore ts;
    ts.put("4fd1/add_kernel.json", "{}");
    ts.put("4fd1/add_kernel.ttgir", "ir");
    ts.put("4fd1/add_kernel.cubin", "bin");
    ts.put("wave1/module.vmfb", "bin");
    ts.put("plain/notes.txt", "x");
    CHECK(ts.entry("4fd1").producer == Producer::triton);
    CHECK(ts.entry("wave1").producer == Producer::wave);
    CHECK(ts.entry("plain").producer == Producer::unknown);
}

TEST_CASE("roles: names of roles and producers are distinct", "[roles]") {
    std::set<std::string> roles;
    for (auto r : {Role::other, Role::binary, Role::signature, Role::ir}) {
        CHECK(roles.insert(std::string(core::role_name(r))).second);
    }
    CHECK(core::role_name(Role::binary) == "binary");
    std::set<std::string> producers;
    for (auto p :
         {Producer::unknown, Producer::triton, Producer::wave, Producer::inductor, Producer::jax,
          Producer::ccache, Producer::cutedsl, Producer::helion, Producer::kcache}) {
        CHECK(producers.insert(std::string(core::producer_name(p))).second);
    }
    CHECK(core::producer_name(Producer::triton) == "triton");
}
