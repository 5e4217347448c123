"""ctypes binding of the parts of libkcache_loader's C ABI (loader/include/kcache/loader.h)
that the compat suite and bench use. Plain Python 3, no third-party modules."""

import ctypes
from ctypes import (POINTER, Structure, byref, c_char_p, c_int, c_size_t, c_uint32, c_uint64,
                    c_void_p)

OK = 0
ERROR_NOT_FOUND = 6
ERROR_ARGUMENT_MISMATCH = 7
ERROR_NO_DRIVER = 9
ERROR_NO_DEVICE = 10
ERROR_NO_BINARY = 11


class Param(Structure):
    _fields_ = [("index", c_uint32), ("offset", c_uint32), ("size", c_uint32)]


class Selection(Structure):
    _fields_ = [("file", c_char_p), ("format", c_char_p), ("arch", c_char_p), ("jit", c_int),
                ("fatbin_entry", c_int)]


class SigParam(Structure):
    _fields_ = [("name", c_char_p), ("type", c_char_p), ("size", c_uint32)]


class LaunchConfig(Structure):
    _fields_ = [("grid", c_uint32 * 3), ("block", c_uint32 * 3), ("shared_memory", c_uint32),
                ("stream", c_void_p)]


class LoaderError(Exception):
    def __init__(self, call, status, message):
        super().__init__(f"{call}: status {status}: {message}")
        self.status = status


class Loader:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        self.lib = lib
        sigs = {
            "kcache_status_name": (c_char_p, [c_int]),
            "kcache_last_error": (c_char_p, []),
            "kcache_inspect": (c_int, [c_void_p, c_size_t, POINTER(c_void_p)]),
            "kcache_binary_free": (None, [c_void_p]),
            "kcache_binary_format": (c_char_p, [c_void_p]),
            "kcache_binary_arch": (c_char_p, [c_void_p]),
            "kcache_binary_kernel_count": (c_size_t, [c_void_p]),
            "kcache_binary_kernel_name": (c_char_p, [c_void_p, c_size_t]),
            "kcache_binary_find_kernel": (c_int, [c_void_p, c_char_p, POINTER(c_size_t)]),
            "kcache_binary_param_count": (c_size_t, [c_void_p, c_size_t]),
            "kcache_binary_param": (c_int, [c_void_p, c_size_t, c_size_t, POINTER(Param)]),
            "kcache_check_arguments": (c_int, [c_void_p, c_size_t, POINTER(c_size_t), c_size_t]),
            "kcache_cache_open": (c_int, [c_char_p, POINTER(c_void_p)]),
            "kcache_cache_close": (None, [c_void_p]),
            "kcache_cache_kind": (c_char_p, [c_void_p]),
            "kcache_entry_open": (c_int, [c_void_p, c_char_p, POINTER(c_void_p)]),
            "kcache_entry_close": (None, [c_void_p]),
            "kcache_entry_file_count": (c_size_t, [c_void_p]),
            "kcache_entry_file_name": (c_char_p, [c_void_p, c_size_t]),
            "kcache_entry_file_size": (c_uint64, [c_void_p, c_size_t]),
            "kcache_entry_read": (c_int, [c_void_p, c_char_p, POINTER(c_void_p),
                                          POINTER(c_size_t)]),
            "kcache_entry_select_binary": (c_int, [c_void_p, c_int, POINTER(Selection)]),
            "kcache_entry_signature": (c_int, [c_void_p, POINTER(c_void_p)]),
            "kcache_signature_free": (None, [c_void_p]),
            "kcache_signature_format": (c_char_p, [c_void_p]),
            "kcache_signature_kernel": (c_char_p, [c_void_p]),
            "kcache_signature_binary": (c_char_p, [c_void_p]),
            "kcache_signature_has_params": (c_int, [c_void_p]),
            "kcache_signature_param_count": (c_size_t, [c_void_p]),
            "kcache_signature_param": (c_int, [c_void_p, c_size_t, POINTER(SigParam)]),
            "kcache_signature_launch_config": (None, [c_void_p, POINTER(LaunchConfig)]),
            "kcache_runtime_open": (c_int, [c_void_p, POINTER(c_void_p)]),
            "kcache_runtime_close": (None, [c_void_p]),
            "kcache_runtime_get_kernel": (c_int, [c_void_p, c_void_p, c_char_p, c_char_p,
                                                  POINTER(c_void_p)]),
            "kcache_kernel_release": (None, [c_void_p]),
            "kcache_kernel_param_count": (c_size_t, [c_void_p]),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes

    def last_error(self):
        return self.lib.kcache_last_error().decode()

    def check(self, call, status):
        if status != OK:
            raise LoaderError(call, status, self.last_error())

    # -- caches and entries ------------------------------------------------------------

    def open_cache(self, path):
        handle = c_void_p()
        self.check(f"kcache_cache_open({path})",
                   self.lib.kcache_cache_open(str(path).encode(), byref(handle)))
        return Cache(self, handle)

    def inspect(self, data):
        handle = c_void_p()
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self.check("kcache_inspect", self.lib.kcache_inspect(buf, len(data), byref(handle)))
        return Binary(self, handle)

    def runtime_open(self):
        """(status, message, handle or None)."""
        handle = c_void_p()
        status = self.lib.kcache_runtime_open(None, byref(handle))
        if status != OK:
            return status, self.last_error(), None
        return status, "", handle


class Cache:
    def __init__(self, loader, handle):
        self.loader, self.handle = loader, handle

    def close(self):
        self.loader.lib.kcache_cache_close(self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def kind(self):
        return self.loader.lib.kcache_cache_kind(self.handle).decode()

    def open_entry(self, key):
        handle = c_void_p()
        self.loader.check(f"kcache_entry_open({key})",
                          self.loader.lib.kcache_entry_open(self.handle, key.encode(),
                                                            byref(handle)))
        return Entry(self.loader, handle, key)


class Entry:
    def __init__(self, loader, handle, key):
        self.loader, self.handle, self.key = loader, handle, key

    def close(self):
        self.loader.lib.kcache_entry_close(self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def files(self):
        lib = self.loader.lib
        return {lib.kcache_entry_file_name(self.handle, i).decode():
                lib.kcache_entry_file_size(self.handle, i)
                for i in range(lib.kcache_entry_file_count(self.handle))}

    def read(self, name):
        data, size = c_void_p(), c_size_t()
        self.loader.check(f"kcache_entry_read({self.key}, {name})",
                          self.loader.lib.kcache_entry_read(self.handle, name.encode(),
                                                            byref(data), byref(size)))
        return ctypes.string_at(data, size.value)

    def select_binary(self, sm):
        """(status, dict or message)."""
        sel = Selection()
        status = self.loader.lib.kcache_entry_select_binary(self.handle, sm, byref(sel))
        if status != OK:
            return status, self.loader.last_error()
        return status, {"file": sel.file.decode(), "format": sel.format.decode(),
                        "arch": sel.arch.decode(), "jit": sel.jit,
                        "fatbin_entry": sel.fatbin_entry}

    def signature(self):
        lib = self.loader.lib
        handle = c_void_p()
        self.loader.check(f"kcache_entry_signature({self.key})",
                          lib.kcache_entry_signature(self.handle, byref(handle)))
        try:
            config = LaunchConfig()
            lib.kcache_signature_launch_config(handle, byref(config))
            params = []
            for i in range(lib.kcache_signature_param_count(handle)):
                p = SigParam()
                self.loader.check("kcache_signature_param",
                                  lib.kcache_signature_param(handle, i, byref(p)))
                params.append({"name": p.name.decode(), "type": p.type.decode(),
                               "size": p.size})
            return {
                "format": lib.kcache_signature_format(handle).decode(),
                "kernel": lib.kcache_signature_kernel(handle).decode(),
                "binary": lib.kcache_signature_binary(handle).decode(),
                "has_params": bool(lib.kcache_signature_has_params(handle)),
                "params": params,
                "grid": list(config.grid),
                "block": list(config.block),
                "shared_memory": config.shared_memory,
            }
        finally:
            lib.kcache_signature_free(handle)


class Binary:
    def __init__(self, loader, handle):
        self.loader, self.handle = loader, handle

    def close(self):
        self.loader.lib.kcache_binary_free(self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self):
        lib = self.loader.lib
        kernels = []
        for k in range(lib.kcache_binary_kernel_count(self.handle)):
            params = []
            for i in range(lib.kcache_binary_param_count(self.handle, k)):
                p = Param()
                self.loader.check("kcache_binary_param",
                                  lib.kcache_binary_param(self.handle, k, i, byref(p)))
                params.append({"index": p.index, "offset": p.offset, "size": p.size})
            kernels.append({"name": lib.kcache_binary_kernel_name(self.handle, k).decode(),
                            "params": params})
        return {"format": lib.kcache_binary_format(self.handle).decode(),
                "arch": lib.kcache_binary_arch(self.handle).decode(), "kernels": kernels}

    def check_arguments(self, kernel_index, sizes):
        arr = (c_size_t * len(sizes))(*sizes)
        return self.loader.lib.kcache_check_arguments(self.handle, kernel_index, arr, len(sizes))
