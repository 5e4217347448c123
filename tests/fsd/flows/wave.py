"""Wave's kernel cache (iree/turbine/kernel/wave/cache.py): a directory per kernel
hash holding `<hash>.vmfb`, `<hash>.json` and `<hash>.mlir`, each written in place with
open(..., 'wb') (O_TRUNC, no rename); a lookup checks the directory exists, then reads
the three files."""

import os

import common

EXTENSIONS = [".vmfb", ".json", ".mlir"]


def main():
    args = common.parse_args(__doc__)
    for i in range(args.keys):
        key = common.key_of("wave", i)
        cache_dir = os.path.join(args.root, key)
        files = {key + ext: common.content(key, ext) for ext in EXTENSIONS}
        if args.mode == "store":
            if os.path.exists(cache_dir):
                common.fail(f"{cache_dir} exists before the store")
            os.makedirs(cache_dir, exist_ok=True)
            for name, data in files.items():
                with open(os.path.join(cache_dir, name), "wb") as f:
                    f.write(data)
            for name, data in files.items():  # loaded right after compiling
                common.expect_bytes(os.path.join(cache_dir, name), data)
        else:
            if os.path.exists(os.path.join(args.root, key + "-not-compiled")):
                common.fail("a key never stored exists")
            if not os.path.exists(cache_dir):
                common.fail(f"key {key}: {cache_dir} missing (a miss on lookup)")
            for name, data in files.items():
                common.expect_bytes(os.path.join(cache_dir, name), data)


if __name__ == "__main__":
    main()
