"""torch.compile (Inductor, CPU) of a few small models with TORCHINDUCTOR_CACHE_DIR
taken from the environment; writes a JSON report: Inductor's cache counters (FX graph
cache hits/misses, AOTAutograd cache), the number of graphs compiled, the C++ builds
that ran (g++: a kernel or wrapper .so that was not in the cache, even on an FX graph
hit), and the outputs (compared by the driver between runs and against eager here).

    python inductor_worker.py --out RESULT.json
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor import cpp_builder  # noqa: E402

CPP_BUILDS = []  # the targets of every C++ build run, in order

_original_build = cpp_builder.CppBuilder.build


def _counting_build(self):
    CPP_BUILDS.append(os.path.basename(self.get_target_file_path()))
    return _original_build(self)


cpp_builder.CppBuilder.build = _counting_build


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TwoGraphs(torch.nn.Module):
    """A graph break in the middle: two FX graphs."""

    def forward(self, x):
        y = torch.sin(x) * 2 + x.sum(dim=-1, keepdim=True)
        torch._dynamo.graph_break()
        return torch.softmax(y * y, dim=-1)


def pointwise_reduce(x, y):
    return (torch.exp(-x * y) + torch.cos(x)).mean(dim=0)


def run(report):
    torch.manual_seed(0)
    outputs = {}
    checks = []

    def record(name, compiled, eager_fn, *inputs):
        with torch.no_grad():
            got = compiled(*inputs)
            want = eager_fn(*inputs)
        checks.append((name, bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5))))
        outputs[name] = [round(v, 6) for v in got.flatten().tolist()[:64]]

    mlp = Mlp().eval()
    mlp_c = torch.compile(mlp, dynamic=False)
    record("mlp_static_4", mlp_c, mlp, torch.randn(4, 16))

    two = TwoGraphs()
    two_c = torch.compile(two, dynamic=False)
    record("two_graphs", two_c, two, torch.randn(3, 5))

    dyn_c = torch.compile(pointwise_reduce, dynamic=True)
    for n in (6, 11):
        record(f"dynamic_{n}", dyn_c, pointwise_reduce, torch.randn(n, 7), torch.randn(n, 7))

    report["outputs"] = outputs
    report["allclose"] = dict(checks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report = {"pid": os.getpid(), "torch": torch.__version__}
    start = time.perf_counter()
    run(report)
    report["seconds"] = time.perf_counter() - start
    report["counters"] = {group: dict(values) for group, values in counters.items()
                          if group in ("inductor", "aot_autograd", "stats")}
    inductor = counters["inductor"]
    report["fxgraph_cache_hit"] = inductor.get("fxgraph_cache_hit", 0)
    report["fxgraph_cache_miss"] = inductor.get("fxgraph_cache_miss", 0)
    report["fxgraph_cache_bypass"] = inductor.get("fxgraph_cache_bypass", 0)
    report["unique_graphs"] = counters["stats"].get("unique_graphs", 0)
    report["cpp_builds"] = CPP_BUILDS
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
