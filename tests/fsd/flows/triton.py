"""Triton's FileCacheManager (triton/runtime/cache.py): one directory per key; every
file is written into a private `tmp.pid_<pid>_<uuid>` directory inside the key
directory, moved into place with os.replace and the temporary directory removed with
os.removedirs (which walks upward and must stop at the non-empty key directory); a
group file `__grp__<name>.json` holding absolute child paths is written last. The
constructor creates the key directory (exist_ok) before any lookup."""

import ctypes
import json
import os
import uuid

import common


class FileCacheManager:
    def __init__(self, root, key):
        self.key = key
        self.cache_dir = os.path.join(root, key)
        os.makedirs(self.cache_dir, exist_ok=True)

    def _make_path(self, filename):
        return os.path.join(self.cache_dir, filename)

    def has_file(self, filename):
        return os.path.exists(self._make_path(filename))

    def get_file(self, filename):
        return self._make_path(filename) if self.has_file(filename) else None

    def get_group(self, filename):
        grp_filename = f"__grp__{filename}"
        if not self.has_file(grp_filename):
            return None
        with open(self._make_path(grp_filename)) as f:
            grp_data = json.load(f)
        child_paths = grp_data.get("child_paths", None)
        if child_paths is None:
            return None
        result = {}
        for c, p in child_paths.items():
            if os.path.exists(p):
                result[c] = p
        return result

    def put_group(self, filename, group):
        grp_contents = json.dumps({"child_paths": group})
        return self.put(grp_contents, f"__grp__{filename}", binary=False)

    def put(self, data, filename, binary=True):
        if not self.cache_dir:
            raise RuntimeError("Could not create or locate cache dir")
        if not binary:
            data = str(data)
        filepath = self._make_path(filename)
        rnd_id = str(uuid.uuid4())
        pid = os.getpid()
        temp_dir = os.path.join(self.cache_dir, f"tmp.pid_{pid}_{rnd_id}")
        os.makedirs(temp_dir, exist_ok=True)
        temp_path = os.path.join(temp_dir, filename)
        mode = "wb" if binary else "w"
        with open(temp_path, mode) as f:
            f.write(data)
        os.replace(temp_path, filepath)
        os.removedirs(temp_dir)
        return filepath


FILES = ["kernel.source", "kernel.ttir", "kernel.ttgir", "kernel.llir", "kernel.ptx",
         "kernel.cubin", "kernel.json"]
TEXT = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".json")


def expected_files(key, so_bytes):
    """name -> bytes on disk. Triton writes IR and metadata as text, binaries as bytes."""
    files = {}
    for name in FILES:
        data = common.content(key, name)
        files[name] = data.hex().encode() if name.endswith(TEXT) else data
    if so_bytes is not None:
        files["__triton_launcher.so"] = so_bytes
    return files


def load(paths, files, dlopen):
    """What Triton does with a group: read the metadata and binaries, dlopen the launcher."""
    if paths is None:
        common.fail("group file vanished")
    for name, data in files.items():
        if name not in paths:
            common.fail(f"group lacks {name}: {sorted(paths)}")
        common.expect_bytes(paths[name], data)
    if dlopen and "__triton_launcher.so" in paths:
        lib = ctypes.CDLL(paths["__triton_launcher.so"])
        if lib.kcache_testlib_answer(20) != 41:
            common.fail("the launcher .so loaded from the cache returned a wrong answer")


def main():
    args = common.parse_args(__doc__)
    so_bytes = None
    if args.so:
        with open(args.so, "rb") as f:
            so_bytes = f.read()
    for i in range(args.keys):
        key = common.key_of("triton", i)
        files = expected_files(key, so_bytes)
        cache = FileCacheManager(args.root, key)
        group = cache.get_group("kernel.json")
        if args.mode == "store":
            if group is not None:
                common.fail(f"key {key} already cached before the store")
            paths = {}
            for name, data in files.items():
                text = name.endswith(TEXT)
                paths[name] = cache.put(data.decode() if text else data, name, binary=not text)
            cache.put_group("kernel.json", paths)
            # The compiler then loads what it just stored (no hit: it populated it).
            load(cache.get_group("kernel.json"), files, dlopen=True)
            leftovers = [n for n in os.listdir(cache.cache_dir) if n.startswith("tmp.")]
            if leftovers:
                common.fail(f"temporary dirs left in {cache.cache_dir}: {leftovers}")
        else:
            if group is None:
                common.fail(f"key {key}: no group file (a miss on lookup)")
            load(group, files, dlopen=True)
            # A compiler may read the same files again: still one hit per entry.
            load(cache.get_group("kernel.json"), files, dlopen=False)


if __name__ == "__main__":
    main()
