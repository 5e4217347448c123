"""JAX's persistent compilation cache (GFileCache): flat files `<key>-cache` at the top
of the cache dir, written to a temporary file there and renamed into place; a lookup
tests existence and reads the whole file."""

import os

import common


def main():
    args = common.parse_args(__doc__)
    for i in range(args.keys):
        key = "jit_kernel-" + common.key_of("jax", i)
        path = os.path.join(args.root, f"{key}-cache")
        data = common.content(key, "executable", min_size=1000, max_size=200000)
        if args.mode == "store":
            if os.path.exists(path):
                common.fail(f"{path} exists before the store")
            tmp_path = os.path.join(args.root, f"_temp_{key}-cache")
            with open(tmp_path, "wb") as f:
                f.write(data)
            os.rename(tmp_path, path)
            if os.path.exists(tmp_path):
                common.fail(f"{tmp_path} still exists after the rename")
            common.expect_bytes(path, data)
        else:
            if os.path.exists(os.path.join(args.root, f"{key}-missing-cache")):
                common.fail("a key never stored exists")
            if not os.path.exists(path):
                common.fail(f"{path} missing (a miss on lookup)")
            common.expect_bytes(path, data)


if __name__ == "__main__":
    main()
