"""Triton's own launcher-module cache code, as each user of a shared node runs it
(tests/compat/users.py): triton.runtime.build derives a module's cache key from its C
source (sha256 of the source, the platform and the build configuration: the same for
every user of one Triton), looks the module up with FileCacheManager.get_file and,
on a miss, builds it with CC, puts it and exec_module()s it.

    launcher_worker.py --out JSON --source FILE --name MOD MODE [--plant SO]

MODE compile: what Triton's driver does (compile_module_from_src): the report says
what the loaded module's `who` is. MODE lookup: only get_file (no build, no load).
MODE plant: put SO's bytes under the key Triton derives for FILE, through Triton's
own FileCacheManager, as an attacker who knows Triton's key derivation would.
TRITON_CACHE_DIR says where the cache is.
"""

import argparse
import json
import sysconfig

import triton.runtime.build as build


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--plant")
    parser.add_argument("mode", choices=["compile", "lookup", "plant"])
    args = parser.parse_args()

    src = open(args.source).read()
    filename = args.name + sysconfig.get_config_var("EXT_SUFFIX")
    # The configuration compile_module_from_src hashes (runtime/build.py, _compile_so).
    config = dict(language=["c"], library_dirs=None, include_dirs=None, libraries=None,
                  ccflags=None)
    cache = build._get_cache_manager(src.encode("utf-8"), config=config)
    report = {"key": cache.key, "file": filename}
    if args.mode == "compile":
        module = build.compile_module_from_src(src, args.name)
        report["who"] = getattr(module, "who", None)
        report["path"] = module.__file__
    elif args.mode == "lookup":
        report["path"] = cache.get_file(filename)
    else:
        with open(args.plant, "rb") as f:
            report["path"] = cache.put(f.read(), filename, binary=True)
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
