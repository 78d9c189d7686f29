"""`latte bench ops`: runtime and memory of the attention ops (docs/evaluation.md §1).

Every provider in latte.bench.providers is timed side by side in this one
process with the same threads, T ascending, forward (no autograd) and
forward+backward. Peak memory is measured afterwards in a worker process
(latte.bench.common). Slow Python-loop providers run only while one point
(warm-up + repeats) fits the time cap; naive softmax only below a memory cap;
both are recorded as skipped with the reason otherwise.

    python -m latte.bench.ops [--quick] [--threads 2] [--out bench-results]
    python -m latte.bench.ops --count-ops     # ATen ops per forward+backward vs T, CPU and GPU segments (op_count.py)
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch

from latte import reporting
from latte.arguments import int_at_least, number
from latte.layers import LatteAttention
from latte.ops import distributions as dists
from latte.ops import linear_recurrence

from . import common, cuda, fixed_shapes, op_count
from . import providers as P
from .cuda import PROVIDERS as CUDA_PROVIDERS
from .device import add_device_args, check_device, resolve_device_args

FULL_T = [512, 1024, 2048, 4096, 8192, 16384]
LATTE_EXTRA_T = [32768, 65536]
QUICK_T, QUICK_EXTRA_T = [32, 64], [128]
MODES = ("fwd", "fwdbwd")
# providers also timed on the other input distributions (--dists); the
# per-step loops, the naive matrix and the projections run on the first only
DIST_PROVIDERS = ("latte", "macchiato", "sdpa", "linear")
# the median-ms tables' ratio columns; "macchiato-window-mix/sdpa": Macchiato's window and mix
# phases over softmax attention (issue 56's target on a GPU: <= 0.5 at T = 4K)
RATIO_COLUMNS = ("sdpa/latte", "latte/proj", "macchiato-window-mix/sdpa")
MODE_NAME = {"fwd": "forward", "fwdbwd": "forward+backward"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="latte bench ops", description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    add_device_args(p)  # --device cuda: latte.bench.cuda (its own providers and options)
    cuda.add_args(p)
    p.add_argument("--providers", default=None, help="comma-separated subset")
    positive = number("a number > 0", lambda v: v > 0)
    p.add_argument("--time-cap", type=positive, default=20.0, help="seconds per point for the slow loop providers")
    p.add_argument("--naive-mem-cap-gb", type=positive, default=6.0, help="skip naive-softmax above this estimate")
    p.add_argument("--recurrent-max-t", type=int_at_least(1), default=2048, help="longest T for latte-recurrent")
    p.add_argument("--rglru-t", type=int_at_least(1), default=None, help="T of the linear_recurrence comparison (4096)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory worker")
    p.add_argument(
        "--count-ops",
        action="store_true",
        help="only count the ATen ops per forward+backward of latte_causal, T = 1K..16K, under the CPU's "
        "and an 80 GB GPU's segment policy (op_count.py)",
    )
    p.add_argument(
        "--dists",
        default="std1,std10",
        help=f"input distributions of the key logits, side by side (first: the main tables); "
        f"allowed {list(dists.DISTRIBUTIONS[:-1])}",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the T sweep (run only the tables by distribution)")
    p.add_argument(
        "--no-causal-table",
        action="store_true",
        help="skip the tables at fixed shapes: latte_causal by key-logit distribution at three "
        "shapes, every provider at a research-sweep model's shape",
    )
    args = p.parse_args(argv)
    resolve_device_args(p, args)
    args.dists = [x for x in args.dists.split(",") if x]
    bad = [x for x in args.dists if x not in dists.DISTRIBUTIONS[:-1]]  # padding: the audit only (no mask in sdpa)
    if bad or not args.dists:
        p.error(f"--dists: unknown {bad or 'none given'}; allowed {list(dists.DISTRIBUTIONS[:-1])}")
    allowed = P.PROVIDERS if args.device == "cpu" else CUDA_PROVIDERS
    args.providers = [x for x in (args.providers or ",".join(allowed)).split(",") if x]
    bad = [x for x in args.providers if x not in allowed]
    if bad:
        p.error(f"--providers: unknown {bad}; allowed {list(allowed)}")
    cuda.resolve_args(p, args)
    return args


def schedule(args) -> dict[str, list[int]]:
    base, extra = (QUICK_T, QUICK_EXTRA_T) if args.quick else (FULL_T, LATTE_EXTRA_T)
    out = {}
    for p in args.providers:
        ts = base + extra if p in ("latte", "proj") else list(base)
        if p == "latte-recurrent":
            ts = [t for t in ts if t <= args.recurrent_max_t]
        out[p] = ts
    return out


def _skip_reason(p, T, mode, last, args):
    if p == "naive-softmax" and P.naive_bytes(T, mode) > args.naive_mem_cap_gb * 2**30:
        return f"materialised T x T needs ~{P.naive_bytes(T, mode) / 2**30:.1f} GiB > {args.naive_mem_cap_gb:g} GiB cap"
    prev = last.get((p, mode))
    if p in P.SLOW and prev is not None:
        if prev[1] is None:
            return "a shorter T already exceeded the time cap"
        pred = prev[1] / 1e3 * T / prev[0] * (args.warmup + args.repeats)
        if pred > args.time_cap:
            return f"predicted {pred:.0f} s for the point > {args.time_cap:g} s cap"
    return None


def _rates(t: dict, p: str, T: int, mode: str, ceiling: float) -> dict:
    if not t.get("skipped"):
        flops = P.flops_forward(p, T) * (1 if mode == "fwd" else 3)
        t["gflop"] = flops / 1e9
        t["gflops"] = flops / t["median_ms"] / 1e6
        t["pct_of_ceiling"] = 100 * t["gflops"] / ceiling
    return t


def _measure_slow(p, T, mode, args, ceiling):
    """A Python-loop provider alone, with the time cap."""
    fn = P.build(p, T, mode)
    t = common.time_call(fn, repeats=args.repeats, warmup=args.warmup, cap_s=args.time_cap)
    del fn
    gc.collect()
    return _rates(t, p, T, mode, ceiling)


def _measure_together(ps, T, mode, args, ceiling) -> dict:
    """The other providers at one (T, mode), on every distribution, timed in
    interleaved rounds so their ratios (sdpa / latte, latte / proj, std10 /
    std1) come from the same moments. Keys: (provider, dist)."""
    fns, out = {}, {}
    for p in ps:
        for d in args.dists if p in DIST_PROVIDERS else args.dists[:1]:
            try:
                fns[(p, d)] = P.build(p, T, mode, dist=d)
            except RuntimeError as e:  # linear attention not written yet
                out[(p, d)] = e
    times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup) if fns else {}
    fns.clear()
    gc.collect()
    out.update({k: _rates(t, k[0], T, mode, ceiling) for k, t in times.items()})
    return out


def sweep(args, ceiling: float) -> tuple[list[dict], dict]:
    plan = schedule(args)
    status = {p: "ok" for p in plan}
    results, last = [], {}

    first = args.dists[0]

    def record(p, T, mode, t, dist=first):
        if dist == first:
            last[(p, mode)] = (T, t.get("median_ms"))
        results.append({"provider": p, "T": T, "mode": mode, "dist": dist, **t})
        print(
            f"  {p:16s} {dist:7s} T={T:6d} {mode:7s} "
            + (f"skipped: {t['reason']}" if t.get("skipped") else f"{t['median_ms']:10.2f} ms"),
            flush=True,
        )

    for T in sorted({t for ts in plan.values() for t in ts}):
        for mode in MODES:
            together = []
            for p in plan:
                if T not in plan[p]:
                    continue
                reason = status[p] if status[p] != "ok" else _skip_reason(p, T, mode, last, args)
                if reason:
                    results.append({"provider": p, "T": T, "mode": mode, "dist": first, **common.skipped(reason)})
                elif p in P.SLOW:
                    record(p, T, mode, _measure_slow(p, T, mode, args, ceiling))
                else:
                    together.append(p)
            for (p, d), t in _measure_together(together, T, mode, args, ceiling).items():
                if isinstance(t, RuntimeError):
                    status[p] = str(t)
                    results.append({"provider": p, "T": T, "mode": mode, "dist": d, **common.skipped(str(t))})
                else:
                    record(p, T, mode, t, d)
    return results, status


def add_memory(results, args) -> None:
    todo = [r for r in results if not r.get("skipped") and r["dist"] == args.dists[0]]
    pts = [{"provider": r["provider"], "T": r["T"], "mode": r["mode"]} for r in todo]
    got = common.memory_points("latte.bench.providers:build", pts, args.threads)
    for r, m in zip(todo, got, strict=True):
        r["peak_mb"] = m["peak_mb"]
        if m.get("note"):
            r["memory_note"] = m["note"]


def rglru(args) -> dict:
    """linear_recurrence's chunked scan vs a per-step Python loop, [1, T, 512]."""

    T = args.rglru_t or (128 if args.quick else 4096)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, T, P.MODEL_DIM, generator=g)
    log_a = -torch.nn.functional.softplus(torch.randn(1, T, P.MODEL_DIM, generator=g))

    def loop(x, log_a):
        h, out = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = torch.exp(log_a[:, t]) * h + x[:, t]
            out.append(h)
        return torch.stack(out, 1)

    def make_call(fn, mode):
        xs = [x.clone().requires_grad_(mode == "fwdbwd"), log_a.clone().requires_grad_(mode == "fwdbwd")]
        if mode == "fwd":
            return torch.no_grad()(lambda: fn(*xs))
        go = torch.randn_like(x)
        return lambda: torch.autograd.grad(fn(*xs), xs, go)

    res = {"T": T, "features": P.MODEL_DIM}
    for name, fn in (("chunked", lambda x, la: linear_recurrence(x, la)[0]), ("loop", loop)):
        for mode in MODES:
            res[f"{name}_{mode}"] = common.time_call(make_call(fn, mode), repeats=args.repeats, warmup=args.warmup)
    for mode in MODES:
        res[f"loop_over_chunked_{mode}"] = res[f"loop_{mode}"]["median_ms"] / res[f"chunked_{mode}"]["median_ms"]
    res["layer"] = rglru_share(x, args)
    return res


def rglru_share(x, args) -> dict:
    """Forward+backward of the RG-LRU mixer (gates and scan) against the whole
    causal LatteAttention layer it sits in (qk_mixer conv_rglru, docs/evaluation.md §1
    shapes), timed in interleaved rounds."""

    torch.manual_seed(0)
    layer = LatteAttention(P.MODEL_DIM, P.HEADS, P.LATENTS // P.HEADS, qk_mixer="conv_rglru", chunk_size=P.CHUNK)
    xs = x.clone().requires_grad_(True)

    def whole():
        layer(xs)[0].sum().backward()

    def mixer():
        layer.mixer.rglru(xs)[0].sum().backward()

    t = common.time_interleaved({"layer": whole, "rglru": mixer}, repeats=args.repeats, warmup=args.warmup)
    return {
        "layer_fwdbwd": t["layer"],
        "rglru_fwdbwd": t["rglru"],
        "share": t["rglru"]["median_ms"] / t["layer"]["median_ms"],
    }


def ratios(results, dist) -> dict:
    med = {
        (r["provider"], r["T"], r["mode"]): r["median_ms"]
        for r in results
        if not r.get("skipped") and r["dist"] == dist
    }
    out = {}
    for num, den in (("sdpa", "latte"), ("latte", "proj"), ("macchiato-window-mix", "sdpa")):
        for mode in MODES:
            out[f"{num}/{den} {mode}"] = {
                str(T): med[(num, T, mode)] / med[(den, T, mode)]
                for (p, T, m) in med
                if p == num and m == mode and (den, T, mode) in med
            }
    return out


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    ceiling = common.matmul_ceiling(512 if args.quick else 2048, repeats=args.repeats)
    print(f"matmul ceiling: {ceiling['gflops_median']:.1f} GFLOP/s (median), threads {args.threads}", flush=True)
    t0 = time.perf_counter()
    results, status = ([], {}) if args.no_sweep else sweep(args, ceiling["gflops_median"])
    if not args.no_memory and results:
        print("peak memory (worker process) ...", flush=True)
        add_memory(results, args)
    causal = None if args.no_causal_table else fixed_shapes.causal_table(args)
    sweep_rows = None if args.no_causal_table else fixed_shapes.sweep_shape(args)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "ops",
        "machine": info,
        "config": {
            "threads": args.threads,
            "dtype": "float32",
            "quick": args.quick,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "time_cap_s": args.time_cap,
            "naive_mem_cap_gb": args.naive_mem_cap_gb,
            "recurrent_max_t": args.recurrent_max_t,
            "dists": args.dists,
            "dist_providers": list(DIST_PROVIDERS),
            "shapes": {
                "B": 1,
                "D": P.MODEL_DIM,
                "H": P.HEADS,
                "L": P.LATENTS,
                "Lh": P.LATENTS // P.HEADS,
                "Dv": P.DV,
                "E": P.DV,
                "chunk_size": P.CHUNK,
                "window_size": P.WINDOW,
            },
            "T": schedule(args),
            "timing": "wall clock; fwd under torch.no_grad; fwdbwd = forward + autograd.grad of all inputs",
            "memory": common.__doc__.split("- peak memory: ")[1].split("- threads")[0].strip(),
        },
        "ceiling": ceiling,
        "flops": P.FLOPS_NOTE,
        "providers": status,
        "results": results,
        "ratios": ratios(results, args.dists[0]),
        "causal_by_distribution": causal,
        "sweep_shape": sweep_rows,
        "rglru": rglru(args),
        "wall_s": time.perf_counter() - t0,
    }


def _cell(results, p, T, mode, key="median_ms", dist=None):
    for r in results:
        if (r["provider"], r["T"], r["mode"]) == (p, T, mode) and r["dist"] == (dist or r["dist"]):
            if r.get("skipped"):
                return "unavail." if r["reason"].startswith("unavailable") else "skip"
            return r.get(key)
    return ""


def _load(machine: dict, key: str) -> str:
    return f"{machine[key][0]:.1f}" if machine.get(key) else "-"


def _by_dist_tables(res: dict) -> list[str]:
    """The T sweep of the DIST_PROVIDERS side by side on every distribution."""
    ds, rs = res["config"]["dists"], res["results"]
    if len(ds) < 2 or not rs:
        return []
    provs = [p for p in res["config"]["T"] if p in DIST_PROVIDERS]
    out = []
    for mode in MODES:
        hdr, rows = ["T"], []
        for p in provs:
            hdr += [f"{p} {d}" for d in ds] + [f"{p} max/min"]
        for T in sorted({r["T"] for r in rs if r["provider"] in provs}):
            row = [str(T)]
            for p in provs:
                cells = [_cell(rs, p, T, mode, dist=d) for d in ds]
                nums = [x for x in cells if isinstance(x, float)]
                row += cells + [f"{max(nums) / min(nums):.2f}" if len(nums) == len(ds) else ""]
            rows.append(row)
        out += ["", f"## {MODE_NAME[mode]} by key-logit distribution: median ms", "", reporting.md_table(hdr, rows)]
    return out


def markdown(res: dict) -> str:
    m, c = res["machine"], res["ceiling"]
    rs = [r for r in res["results"] if r["dist"] == res["config"]["dists"][0]]
    provs = list(res["config"]["T"])
    Ts = sorted({r["T"] for r in rs})
    out = [
        f"# latte bench ops ({'quick' if res['config']['quick'] else 'full'})",
        "",
        f"{m['cpu_model']}, {m['usable_cores']} cores, torch {m['torch']}, {m['threads']} threads, fp32, "
        f"B=1 D=512 H=8 L=256 (Lh=32) dv=64, key logits {res['config']['dists'][0]} "
        f"(other distributions below). Matmul ceiling {c['gflops_median']:.1f} GFLOP/s "
        f"({c['shape'][0]}^3 fp32, median). Median of {res['config']['repeats']} repeats; load avg "
        f"{_load(m, 'loadavg_start')} -> {_load(m, 'loadavg_end')} (other processes on the cores).",
    ]
    tables = [
        ("median ms", "median_ms", True),
        ("achieved GFLOP/s", "gflops", False),
        ("peak extra MiB", "peak_mb", False),
    ]
    for mode in MODES:
        for title, key, with_ratio in tables:
            hdr = ["T"] + provs + (list(RATIO_COLUMNS) if with_ratio else [])
            rows = []
            for T in Ts:
                row = [str(T)] + [_cell(rs, p, T, mode, key) for p in provs]
                if with_ratio:
                    row += [res["ratios"].get(f"{k} {mode}", {}).get(str(T), "") for k in RATIO_COLUMNS]
                rows.append([x if x != "" else "" for x in row])
            out += ["", f"## {MODE_NAME[mode]}: {title}", "", reporting.md_table(hdr, rows)]
    out += _by_dist_tables(res)
    if res.get("causal_by_distribution"):
        out += fixed_shapes.causal_markdown(res["causal_by_distribution"])
    out += fixed_shapes.sweep_shape_table(res)
    first_skip = {}
    for r in rs:
        if r.get("skipped"):
            first_skip.setdefault((r["provider"], r["mode"]), r)
    if first_skip:
        out += ["", "Skipped (first T per provider and mode; every longer T is skipped too):"]
        out += [f"- {p} {mode} from T={r['T']}: {r['reason']}" for (p, mode), r in first_skip.items()]
    g = res["rglru"]
    out += [
        "",
        f"linear_recurrence at T={g['T']} x {g['features']}: per-step loop / chunked scan = "
        f"{g['loop_over_chunked_fwd']:.1f}x forward, {g['loop_over_chunked_fwdbwd']:.1f}x forward+backward "
        f"(chunked {g['chunked_fwd']['median_ms']:.2f} / {g['chunked_fwdbwd']['median_ms']:.2f} ms).",
    ]
    if "layer" in g:
        lay = g["layer"]
        out += [
            "",
            f"RG-LRU mixer (gates + scan) forward+backward: {lay['rglru_fwdbwd']['median_ms']:.1f} ms, "
            f"{lay['share']:.0%} of the whole LatteAttention layer (qk_mixer conv_rglru, "
            f"{lay['layer_fwdbwd']['median_ms']:.1f} ms) at T={g['T']}.",
        ]
    return "\n".join(out) + "\n"


def plot(res: dict, path) -> bool:
    panels = {}
    for mode in MODES:
        series = {}
        for p in res["config"]["T"]:
            pts = [
                (r["T"], r["median_ms"])
                for r in res["results"]
                if r["provider"] == p
                and r["mode"] == mode
                and r["dist"] == res["config"]["dists"][0]
                and not r.get("skipped")
            ]
            series["(projections)" if p == "proj" else p] = ([t for t, _ in pts], [v for _, v in pts])
        panels[MODE_NAME[mode]] = series
    m = res["machine"]
    return common.plot_loglog(
        path,
        panels,
        xlabel="T (tokens)",
        ylabel="median time (ms)",
        title=f"latte bench ops: {m['cpu_model']}, {m['threads']} threads, torch {m['torch']}",
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    name = cuda.output_name(args.dtype) if args.device == "cuda" else "ops-count" if args.count_ops else "ops"
    # before any work: the write rule (latte/guard.py); only the CPU timings replace a README section
    common.claim_outputs(args, "ops", name, sections=[name] if name == "ops" else [])
    if args.device == "cuda":
        check_device(args.device)
        return cuda.main_ops(args)
    if args.count_ops:
        common.set_threads(args.threads)
        res = op_count.run(quick=args.quick)
        common.claim_outputs(args, "ops", "ops-count", create=True)
        common.write_json(args.out / "ops-count.json", res)
        (args.out / "ops-count.md").write_text(op_count.markdown(res))
        print(op_count.markdown(res))
        return res
    res = run(args)
    common.write_outputs(args, "ops", res, markdown(res), plot, image_in_readme=True)
    return res


if __name__ == "__main__":
    main()
