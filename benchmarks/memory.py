"""`python -m benchmarks.memory`: one Macchiato layer with and without memory
slots (docs/math.md §4.2, latte/ops/window/memory.py), prefill and decode.

The shape is one SmolLM2-135M layer as converted: B=1, T=2048, 9 query
heads on 3 key/value heads of width 64, 32 latents per head, a window of
128, 4 sinks and 64 slots, float32 on the CPU. For each selection rule the
layer without memory and the layer with it are timed in interleaved rounds:
prefill (macchiato over T tokens, tokens/s) and one decoding step
(macchiato_step from the state after the prefill, ms/step). Issue 57's
target: decode <= 1.1x and prefill >= 0.8x of the layer without memory.

    python -m benchmarks.memory [--quick] [--rules key_norm,recall] [--threads 1] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks import RESULTS
from latte import bench as common
from latte import reporting
from latte.bench import MEMORY_RULES, Memory
from latte.ops import macchiato, macchiato_step

FULL = dict(T=2048, H=9, K=3, E=64, L=32, W=128, S=4, M=64)
QUICK = dict(T=48, H=4, K=2, E=8, L=4, W=8, S=2, M=4)
PHASES = ("prefill", "decode")


def _rules(text: str) -> list[str]:
    rules = [r for r in text.split(",") if r]
    bad = [r for r in rules if r not in MEMORY_RULES]
    if bad or not rules:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {MEMORY_RULES}, got {text!r}")
    return rules


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    p.add_argument("--rules", type=_rules, default=list(MEMORY_RULES), help="selection rules (default all)")
    args = p.parse_args(argv)
    args.shape = QUICK if args.quick else FULL
    args.dtype = "float32"
    return args


def _inputs(s: dict):
    """The same layer inputs for every rule: a, b, v, q, k, mark [B, T, ...]."""
    g = torch.Generator().manual_seed(0)
    T, H, K, E, L = s["T"], s["H"], s["K"], s["E"], s["L"]
    a, b = torch.randn(1, T, H, L, generator=g), torch.randn(1, T, H, L, generator=g)
    v, q, k = (torch.randn(1, T, n, E, generator=g) for n in (K, H, K))
    mark = torch.rand(1, T, generator=g) < 0.05
    return a, b, v, q, k, mark


def _calls(s: dict, x, rule: str | None) -> dict:
    """(prefill, decode) zero-argument calls of the layer, with memory under
    `rule` or without (None). The decode call is one step from the state
    after the prefill of T - 1 tokens (the same state every call)."""
    a, b, v, q, k, mark = x
    memory = None if rule is None else Memory(s["M"], rule, 0)
    kw = dict(window_size=s["W"], num_sinks=s["S"], memory=memory)
    m = {"memory_mark": mark} if rule == "oracle" else {}
    _, st = macchiato(*(t[:, :-1] for t in (a, b, v, q, k)), output_final_state=True, **kw, **_cut(m))
    mt = {"memory_mark_t": mark[:, -1]} if rule == "oracle" else {}

    @torch.no_grad()
    def prefill():
        return macchiato(a, b, v, q, k, **kw, **m)

    @torch.no_grad()
    def decode():
        return macchiato_step(a[:, -1], b[:, -1], v[:, -1], q[:, -1], k[:, -1], st, **kw, **mt)

    return {"prefill": prefill, "decode": decode}


def _cut(m: dict) -> dict:
    return {name: t[:, :-1] for name, t in m.items()}


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    s, x, rows = args.shape, _inputs(args.shape), []
    for rule in args.rules:
        base, mem = _calls(s, x, None), _calls(s, x, rule)
        for phase in PHASES:
            fns = {"none": base[phase], rule: mem[phase]}
            times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
            for memory, t in times.items():
                per = s["T"] / (t["median_ms"] / 1e3) if phase == "prefill" else None
                rows.append({"rule": rule, "memory": memory, "phase": phase, **t, "tokens_per_s": per})
            ratio = times[rule]["median_ms"] / times["none"]["median_ms"]
            rows.append({"rule": rule, "phase": phase, "ratio_with_to_without": ratio})
            print(f"  {rule:9s} {phase:7s} without {times['none']['median_ms']:9.3f} ms, ratio {ratio:.2f}", flush=True)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    config = {"device": "cpu", "dtype": args.dtype, "threads": args.threads, "quick": args.quick, **s}
    config.update(rules=args.rules, repeats=args.repeats, warmup=args.warmup)
    return {"benchmark": "memory", "machine": info, "config": config, "results": rows}


def markdown(res: dict) -> str:
    m, c = res["machine"], res["config"]
    cell = {(r["rule"], r.get("memory"), r["phase"]): r for r in res["results"]}
    out = [
        f"# latte bench memory (cpu{', quick' if c['quick'] else ''})",
        "",
        f"{m['cpu_model']}, {m['threads']} threads, torch {m['torch']}, {c['dtype']}; one Macchiato layer, "
        f"T={c['T']} H={c['H']} K={c['K']} E={c['E']} latents/head={c['L']} W={c['W']} sinks={c['S']} "
        f"slots={c['M']}; median of {c['repeats']} calls, without and with memory interleaved per rule; "
        f"load avg {m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}. Target (issue 57): decode "
        "<= 1.1x, prefill tokens/s >= 0.8x of the layer without memory.",
        "",
    ]
    hdr = ["rule", "prefill tok/s without", "with", "with/without", "decode ms without", "with", "with/without"]
    rows = []
    for rule in c["rules"]:
        p0, p1 = cell[(rule, "none", "prefill")], cell[(rule, rule, "prefill")]
        d0, d1 = cell[(rule, "none", "decode")], cell[(rule, rule, "decode")]
        rows.append(
            [rule, f"{p0['tokens_per_s']:,.0f}", f"{p1['tokens_per_s']:,.0f}"]
            + [f"{p1['tokens_per_s'] / p0['tokens_per_s']:.2f}", f"{d0['median_ms']:.3f}", f"{d1['median_ms']:.3f}"]
            + [f"{d1['median_ms'] / d0['median_ms']:.2f}"]
        )
    return "\n".join(out + [reporting.md_table(hdr, rows)]) + "\n"


def plot(res: dict, path) -> bool:
    """Median ms without and with memory per rule (x: the rules' order, 1..n), one panel per phase."""
    c, panels = res["config"], {}
    xs = list(range(1, len(c["rules"]) + 1))
    for phase in PHASES:
        cell = {
            (r["rule"], r["memory"]): r["median_ms"]
            for r in res["results"]
            if r.get("phase") == phase and "memory" in r
        }
        panels[f"{phase}: median ms"] = {
            "without": (xs, [cell[(rule, "none")] for rule in c["rules"]]),
            "with": (xs, [cell[(rule, rule)] for rule in c["rules"]]),
        }
    rules = ", ".join(f"{i} {r}" for i, r in zip(xs, c["rules"]))
    return common.plot_loglog(path, panels, xlabel=f"rule ({rules})", ylabel="ms", title="latte bench memory")


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.claim_outputs(args, "memory", "memory")  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, "memory", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.memory", main, sys.argv[1:]))
