"""Shared benchmark machinery: timing, peak memory, the log-log plot and the
NAME.json / .md / .png outputs of every benchmark (machine info, tables and
figures come from latte.reporting).

What is measured (numbers are recorded, never asserted):
- time: `time_call` runs warm-up calls, then >= 5 timed calls; the median and
  the minimum wall time (ms) are reported with the raw list.
- peak memory: `memory_points` runs the points in a fresh worker process whose
  glibc is told to serve every allocation >= 4 KiB with mmap, so freed
  tensors leave the resident set at once (RSS tracks live memory). For each
  point the worker runs one warm-up call at a tiny size (library init),
  allocates the inputs, resets the kernel's peak-RSS mark
  (`/proc/self/clear_refs` "5"), runs one call and reports
  VmHWM - VmRSS(before): the peak resident memory the call adds on top of its
  inputs (outputs, autograd graph and gradients included; allocator and
  thread-pool overheads too). Linux only; elsewhere it is None.
- threads: `torch.set_num_threads` is always set explicitly (default 2).
- a matmul GFLOP/s ceiling (2048 x 2048 fp32 matmul) measured in the same run.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from latte import allocator, reporting
from latte.arguments import int_at_least
from latte.files import write_json
from latte.guard import check_place, claim_files

DEFAULT_THREADS = 2
DEFAULT_OUT = "bench-results"
# The write rule (latte/guard.py: claim_files): the benchmarks share their
# --out folder (benchmarks/, bench-results/), each writing only its own files.
# A new folder's marker names BENCH_FOLDER; the GPU suite's folder (marked by
# "latte bench suite", experiments/gpu_suite/state.py) takes them too: its
# stages run them there.
BENCH_FOLDER = "latte bench"
BENCH_FOLDER_OWNERS = (BENCH_FOLDER, "latte bench suite")


def set_threads(threads: int) -> None:
    if threads < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {threads}")
    torch.set_num_threads(threads)
    allocator.tune()  # as `latte train` runs; recorded in machine_info


def time_call(fn, *, repeats: int = 5, warmup: int = 1, cap_s: float | None = None) -> dict:
    """Median/min wall time of `fn()` in ms. With cap_s, the first warm-up call
    is timed and the point is abandoned (skipped=True) if warm-up + repeats
    would exceed cap_s seconds."""
    if repeats < 5:
        raise ValueError(f"repeats: expected >= 5, got {repeats}")
    for i in range(max(warmup, 1 if cap_s else 0)):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if cap_s is not None and i == 0 and dt * (warmup + repeats) > cap_s:
            return skipped(f"one call took {dt:.1f} s; {warmup + repeats} calls exceed the {cap_s:g} s cap")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "repeats": repeats,
        "warmup": warmup,
        "times_ms": [round(t, 4) for t in times],
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,  # others on the cores?
    }


def time_interleaved(fns: dict, *, repeats: int = 5, warmup: int = 1) -> dict:
    """time_call for several functions in rounds (a, b, c, a, b, c, ...), so
    that drift on a shared machine (other jobs, the allocator warming up)
    lands on all of them alike and their ratios stay meaningful."""
    if repeats < 5:
        raise ValueError(f"repeats: expected >= 5, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        name: {
            "median_ms": statistics.median(ts),
            "min_ms": min(ts),
            "repeats": repeats,
            "warmup": warmup,
            "times_ms": [round(t, 4) for t in ts],
            "loadavg_1min": load,
            "interleaved": True,
        }
        for name, ts in times.items()
    }


def skipped(reason: str) -> dict:
    return {"skipped": True, "reason": reason}


def matmul_ceiling(n: int = 2048, repeats: int = 5) -> dict:
    """Achieved GFLOP/s of an n x n fp32 matmul with the current threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = time_call(lambda: a @ b, repeats=repeats, warmup=2)
    flops = 2 * n**3
    return {
        "shape": [n, n, n],
        "dtype": "float32",
        **t,
        "gflops_median": flops / t["median_ms"] / 1e6,
        "gflops_best": flops / t["min_ms"] / 1e6,
    }


# ---- peak memory ---------------------------------------------------------------


def _status_kb(key: str) -> int:
    m = re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text())
    return int(m.group(1))


def _worker() -> None:
    """Child side of memory_points: JSON job on stdin, one JSON line per point."""
    job = json.loads(sys.stdin.read())
    set_threads(job["threads"])
    mod, name = job["target"].split(":")
    build = getattr(importlib.import_module(mod), name)
    for point in job["points"]:
        small = {**point, **{k: min(point[k], 64) for k in job["shrink"] if k in point}}
        build(**small)()  # warm-up at a tiny size: library init, thread pools
        fn = build(**point)  # allocates the inputs
        gc.collect()
        base = _status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark
        fn()
        peak = _status_kb("VmHWM")
        print(json.dumps({**point, "peak_mb": max(peak - base, 0) / 1024, "baseline_rss_mb": base / 1024}), flush=True)
        del fn
        gc.collect()


def memory_points(
    target: str, points: list[dict], threads: int, *, shrink: tuple[str, ...] = ("T",), timeout_s: float = 1800
) -> list[dict]:
    """Peak extra resident memory (MiB) of one call per point, in a fresh
    process (see the module docstring). `target` is "module:function"; the
    function takes a point's keys and returns a zero-argument callable; the
    warm-up call uses the same point with the `shrink` keys capped at 64. A
    point that kills the worker (e.g. out of memory) gets peak_mb None and a
    note; a new worker then goes on with the next point."""
    if not Path("/proc/self/clear_refs").exists():
        return [{**p, "peak_mb": None, "note": "needs Linux /proc"} for p in points]
    # LATTE_MALLOC=default: the worker must not apply latte.allocator.tune
    # (M_MMAP_MAX=0 would keep freed memory resident and hide every peak)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="65536", LATTE_MALLOC="default")
    cmd = [sys.executable, "-c", "from latte.bench.common import _worker; _worker()"]
    results: list[dict] = []
    while len(results) < len(points):
        todo = points[len(results) :]
        job = json.dumps({"target": target, "points": todo, "threads": threads, "shrink": list(shrink)})
        try:
            proc = subprocess.run(cmd, input=job, capture_output=True, text=True, env=env, timeout=timeout_s)
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = f"worker timed out after {timeout_s:g} s"
        done = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        results += done
        if len(done) < len(todo):  # the worker died on todo[len(done)]
            note = (err.strip().splitlines() or ["worker died (killed: out of memory?)"])[-1][:200]
            results.append({**todo[len(done)], "peak_mb": None, "note": note})
    return results


# ---- output --------------------------------------------------------------------


def plot_loglog(
    path: Path, panels: dict[str, dict[str, tuple[list, list]]], *, xlabel: str, ylabel: str, title: str
) -> bool:
    """One log-log panel per key of `panels` ({panel: {label: (xs, ys)}}).
    matplotlib is optional (extra "plot"): without it, print a note and return False."""
    plt = reporting.pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    labels = list(dict.fromkeys(k for series in panels.values() for k in series))
    color = {k: f"C{i % 10}" for i, k in enumerate(labels)}  # same colour in every panel
    for ax, (name, series) in zip(axes[0], panels.items()):
        for label, (xs, ys) in series.items():
            if xs:
                ax.plot(
                    xs, ys, marker="o", ms=3, label=label, color=color[label], ls="--" if label.startswith("(") else "-"
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    reporting.save_figure(plt, fig, path)
    return True


def add_common_args(p, *, repeats: int = 5, out: str = DEFAULT_OUT) -> None:
    p.add_argument("--threads", type=int_at_least(1), default=DEFAULT_THREADS, help="torch.set_num_threads (default 2)")
    p.add_argument("--repeats", type=int_at_least(5), default=repeats, help="timed repeats per point (>= 5)")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed warm-up calls per point")
    p.add_argument("--out", type=Path, default=Path(out), help=f"output folder (default {out}/)")
    p.add_argument("--quick", action="store_true", help="tiny sizes for CI and tests")
    p.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also replace this benchmark's section (between its bench markers) in this markdown file; "
        "the repository's is benchmarks/README.md",
    )


def claim_outputs(
    args, command: str, *names: str, suffixes=(".json", ".md", ".png"), create=False, sections=None
) -> None:
    """NAME.json, .md and .png of each name are files `latte bench COMMAND`
    may write in args.out (new, or written by it before), else a WriteRefused
    (exit 2) naming the folder or file: checked before any work, claimed
    (`create=True`: the folder made, the files recorded in its marker) right
    before writing them. Before any work, --readme too (check_readme) for
    the README sections write_outputs replaces (`sections`, default the
    names). Remembers the writer for write_outputs."""
    args.writer = f"latte bench {command}"
    if not create:
        check_readme(getattr(args, "readme", None), names if sections is None else sections)
    names = [f"{n}{s}" for n in names for s in suffixes]
    claim_files(args.out, args.writer, names, owners=BENCH_FOLDER_OWNERS, flag="--out", create=create)


def check_readme(readme, sections) -> None:
    """--readme before any work: a markdown file outside any run folder,
    checkpoint or model's folder (latte/guard.py), holding the
    `<!-- bench:NAME:start -->` and `:end -->` markers of every section the
    benchmark replaces; else a ValueError (exit 2) naming the file."""
    if readme is None:
        return
    path = Path(readme)
    check_place(path.parent, flag="--readme")
    if not path.is_file():
        raise ValueError(f"--readme {path}: no such file (the repository's is benchmarks/README.md); nothing was run")
    text = path.read_text(encoding="utf-8")
    for name in sections:
        start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
        if start not in text or end not in text:
            raise ValueError(
                f"--readme {path}: no {start} ... {end} markers (add them where the table goes); nothing was run"
            )


def write_outputs(args, name: str, res: dict, markdown: str, plot, *, image_in_readme: bool = False) -> None:
    """NAME.json, NAME.md and NAME.png in args.out, the README section when
    --readme is given, and the table on stdout: the same for every benchmark.
    Checked again by the write rule (claim_outputs) with the writer the
    benchmark's main claimed as."""
    claim_outputs(args, args.writer.removeprefix(f"{BENCH_FOLDER} "), name, create=True)
    write_json(args.out / f"{name}.json", res)
    (args.out / f"{name}.md").write_text(markdown)
    png = args.out / f"{name}.png"
    plot(res, png)
    if args.readme is not None:  # the image link must work from the README's folder
        image = Path(os.path.relpath(png, Path(args.readme).parent)).as_posix() if image_in_readme else None
        reporting.update_readme(args.readme, name, markdown, image)
    print(markdown)
