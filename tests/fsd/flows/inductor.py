"""TorchInductor's write_atomic (torch/_inductor/codecache.py): content goes to
`.<pid>.<thread>.tmp` in the target's directory, then Path.rename onto the target
(which replaces it). Here one directory per key holds the generated code, its compiled
module and its metadata; a lookup tests os.path.exists and reads the files."""

import os
import threading
from pathlib import Path

import common

FILES = ["output_code.py", "kernel.so", "meta.json"]


def write_atomic(path_, content, make_dirs=False):
    path = Path(path_)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.parent / f".{os.getpid()}.{threading.get_ident()}.tmp"
    write_mode = "w" if isinstance(content, str) else "wb"
    with tmp_path.open(write_mode) as f:
        f.write(content)
    tmp_path.rename(target=path)


def main():
    args = common.parse_args(__doc__)
    for i in range(args.keys):
        key = common.key_of("inductor", i)
        key_dir = os.path.join(args.root, key)
        files = {name: common.content(key, name) for name in FILES}
        if args.mode == "store":
            if os.path.exists(os.path.join(key_dir, FILES[0])):
                common.fail(f"key {key} exists before the store")
            for name, data in files.items():
                write_atomic(os.path.join(key_dir, name), data, make_dirs=True)
            left = [n for n in os.listdir(key_dir) if n.endswith(".tmp")]
            if left:
                common.fail(f"temporary files left in {key_dir}: {left}")
            for name, data in files.items():
                common.expect_bytes(os.path.join(key_dir, name), data)
        else:
            if os.path.exists(os.path.join(args.root, "never" + key, FILES[0])):
                common.fail("a key never stored exists")
            for name, data in files.items():
                path = os.path.join(key_dir, name)
                if not os.path.exists(path):
                    common.fail(f"key {key}: {path} missing (a miss on lookup)")
                common.expect_bytes(path, data)


if __name__ == "__main__":
    main()
