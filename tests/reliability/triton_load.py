"""Real Triton compiles as load on a kcache-fsd mount (tests/reliability/test_takeover.cpp).

The compat suite's kernels (tests/compat/workers/triton_worker.py: its 22 kernels, its
GPU target and its count of compile stages, imported, not copied) compiled ahead of
time for sm_90 (no GPU, no driver needed), round after round, each round into a fresh
TRITON_CACHE_DIR inside the mount, until the stop file exists.

    python triton_load.py --mount MNT --name NAME --stop STOP_FILE --out RESULT.json

Round k compiles into MNT/NAMEr<k>. RESULT.json: {"rounds": [{"dir": ..., "kernels":
[{"label", "hash", "outcome", "stages"}]}]}, outcome "ok", "eio" (an OSError with
errno EIO, raised anywhere in the compile: a takeover lost a write of it), "canceled"
(errno ECANCELED: over io_uring, a kill -9 ends the calls the kernel was handing to the
dying daemon's ring threads; the test decides whether that is allowed) or "error: ..."
(anything else). Exit 0 when every compile was ok, eio or canceled, 1 otherwise.
"""

import argparse
import errno
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compat",
                                "workers"))
import triton_worker  # noqa: E402  (sets Triton up and counts the stages run)
import triton  # noqa: E402


def errno_in(exc, code):
    """True when `exc` or an exception it came from is an OSError with errno `code`."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == code:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def compile_one(label, spec):
    fn, signature, constexprs = spec
    before = len(triton_worker.STAGES_RUN)
    try:
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        kernel = triton.compile(src, target=triton_worker.TARGET)
        outcome, key = "ok", kernel.hash
    except Exception as exc:  # noqa: BLE001 (every failure is reported, EIO or not)
        if errno_in(exc, errno.EIO):
            outcome = "eio"
        elif errno_in(exc, errno.ECANCELED):
            outcome = "canceled"
        else:
            outcome = "error: " + "".join(
                traceback.format_exception_only(type(exc), exc)).strip()
        key = None
    return {"label": label, "hash": key, "outcome": outcome,
            "stages": triton_worker.STAGES_RUN[before:]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mount", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    specs = triton_worker.kernel_specs()
    rounds = []

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"rounds": rounds, "triton": triton.__version__}, f, indent=1)
        os.replace(tmp, args.out)

    k = 0
    while not os.path.exists(args.stop):
        cache_dir = os.path.join(args.mount, f"{args.name}r{k}")
        os.environ["TRITON_CACHE_DIR"] = cache_dir  # read by Triton at each compile
        current = {"dir": cache_dir, "kernels": []}
        rounds.append(current)
        for label, spec in specs.items():
            if os.path.exists(args.stop):
                break
            current["kernels"].append(compile_one(label, spec))
            save()  # what was done so far survives a kill of this process
        k += 1
    save()
    bad = [x for r in rounds for x in r["kernels"] if x["outcome"] not in ("ok", "eio", "canceled")]
    for x in bad:
        print(f"{x['label']}: {x['outcome']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
