#!/usr/bin/env python3
"""Warm-start figures for real compilers: the time of a warm run (everything from the
compiler's cache) with the cache on a kcache mount against a plain directory on the
same disk, measured alternately in one run, and the cold run's time. A benchmark, not a
test: it prints figures and ratios.

    python3 bench/compat_warm.py [--fsd build/fsd/kcache-fsd] [--kcache build/cli/kcache]
        [--python .venv/bin/python] [--rounds 5] [COMPILER ...]

COMPILER: triton, inductor, jax, ccache, wave, cutedsl (default: all whose packages the venv has).
Each warm run is a fresh process (import included: "process"); the workers also time
their compile section alone ("compile"), where the cache's reads are.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "compat"))
import compat  # noqa: E402


def ccache_build(project, env):
    """Three ccache compiles; returns (process seconds, same)."""
    start = time.perf_counter()
    for s in ("a", "b", "c"):
        compat.run(["ccache", "gcc", "-O2", "-c", f"{s}.c", "-o", f"{s}.o"], env=env,
                   cwd=project)
    seconds = time.perf_counter() - start
    return seconds, seconds


def make_runner(cfg, name, tmp):
    """A function (base directory) -> (process seconds, compile seconds)."""
    def from_worker(script, env_var, args=()):
        def go(base):
            extra = [str(a).replace("{base}", str(base)) for a in args]
            env = {env_var: str(Path(base) / name)} if env_var else {}
            r = compat.worker(cfg, script, extra, env)
            return r["wall_seconds"], r["seconds"]
        return go

    if name == "triton":
        return from_worker("triton_worker.py", "TRITON_CACHE_DIR")
    if name == "inductor":
        return from_worker("inductor_worker.py", "TORCHINDUCTOR_CACHE_DIR")
    if name == "wave":
        return from_worker("wave_worker.py", "WAVE_CACHE_DIR")
    if name == "cutedsl":
        return from_worker("cutedsl_worker.py", "CUTE_DSL_CACHE_DIR")
    if name == "jax":
        return from_worker("jax_worker.py", None, ["--cache-dir", "{base}/jax", "--count", "16"])
    if name == "ccache":
        projects = {}  # base directory -> (project, env)

        def go(base):
            if base not in projects:
                projects[base] = compat.ccache_project(Path(tmp) / f"project{len(projects)}",
                                                       Path(base) / "ccache")
            return ccache_build(*projects[base])
        return go
    raise ValueError(name)


MODULES = {"triton": ["triton"], "inductor": ["torch"], "jax": ["jax"], "ccache": [],
           "wave": ["wave_lang"], "cutedsl": ["cutlass"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsd", default=str(REPO / "build" / "fsd" / "kcache-fsd"))
    parser.add_argument("--kcache", default=str(REPO / "build" / "cli" / "kcache"))
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--daemon-arg", action="append", default=[])
    parser.add_argument("compilers", nargs="*")
    args = parser.parse_args()

    cfg = compat.Config()
    cfg.fsd, cfg.kcache, cfg.loader, cfg.python = args.fsd, args.kcache, "", args.python
    cfg.daemon_args = args.daemon_arg
    names = args.compilers or list(MODULES)
    import atexit
    atexit.register(compat.stop_all_daemons)
    rows = []
    for name in names:
        if name == "ccache" and not shutil.which("ccache"):
            print(f"{name}: skipped (no ccache)")
            continue
        try:
            compat.require(cfg, MODULES[name])
        except compat.Skip as e:
            print(f"{name}: skipped ({e})")
            continue
        cfg.tmp = tempfile.mkdtemp(prefix=f"kcache-bench-{name}-")
        try:
            plain = compat.Where(cfg, Path(cfg.tmp) / "p", "plain")
            mount = compat.Where(cfg, Path(cfg.tmp) / "m", "mount")
            go = make_runner(cfg, name, cfg.tmp)
            cold = {"plain": go(plain.base), "mount": go(mount.base)}
            warm = {"plain": [], "mount": []}
            for i in range(args.rounds):
                order = ("mount", "plain") if i % 2 == 0 else ("plain", "mount")
                for kind in order:
                    warm[kind].append(go(mount.base if kind == "mount" else plain.base))
            med = {k: (statistics.median(p for p, _ in v), statistics.median(c for _, c in v))
                   for k, v in warm.items()}
            rows.append((name, cold, med))
            print(f"{name}: cold plain {cold['plain'][0]:.2f}s, mount {cold['mount'][0]:.2f}s; "
                  f"warm (median of {args.rounds}) process plain {med['plain'][0]:.3f}s, "
                  f"mount {med['mount'][0]:.3f}s ({med['mount'][0] / med['plain'][0]:.2f}x); "
                  f"compile section plain {med['plain'][1]:.3f}s, mount {med['mount'][1]:.3f}s "
                  f"({med['mount'][1] / med['plain'][1]:.2f}x)", flush=True)
            mount.close()
        finally:
            compat.stop_all_daemons()
            shutil.rmtree(cfg.tmp, ignore_errors=True)

    print()
    print(f"{'compiler':<10} {'cold plain':>11} {'cold mount':>11} {'warm plain':>11} "
          f"{'warm mount':>11} {'ratio':>7} {'warm compile plain':>19} {'mount':>9} {'ratio':>7}")
    for name, cold, med in rows:
        print(f"{name:<10} {cold['plain'][0]:>10.2f}s {cold['mount'][0]:>10.2f}s "
              f"{med['plain'][0]:>10.3f}s {med['mount'][0]:>10.3f}s "
              f"{med['mount'][0] / med['plain'][0]:>6.2f}x {med['plain'][1]:>18.3f}s "
              f"{med['mount'][1]:>8.3f}s {med['mount'][1] / med['plain'][1]:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
