"""`python -m benchmarks.memory`: one Macchiato layer with and without memory
slots (docs/math.md §4.2, latte/ops/window/memory.py), prefill and decode.

The shape is one SmolLM2-135M layer as converted: B=1, T=2048, 9 query
heads on 3 key/value heads of width 64, 32 latents per head, a window of
128, 4 sinks and 64 slots, float32 on the CPU. For each selection rule the
layer without memory and the layer with it are timed in interleaved rounds:
prefill (macchiato over T tokens, tokens/s) and one decoding step
(macchiato_step from the state after the prefill, ms/step). Issue 57's
target: decode <= 1.1x and prefill >= 0.8x of the layer without memory.

With --model-rules (default key_norm; "" for none) the same is timed for
the whole model at that shape, the issue's unit: a native macchiato
LatteForCausalLM with SmolLM2-135M's sizes (30 layers, width 576, MLP
1536, vocabulary 49,152; random weights, the same with and without
slots), prefill of T tokens and one decoding step from the state after
T - 1.

With --inputs (default std1) the layer is timed on each kind of input
(INPUTS): standard-normal, or like those training produces, since the CPU
prefill skips the candidates that cannot be held and so its time may depend
on the values: key logits (the latents' b and the window keys k) of std 10
or 40, +80 spikes on every 16th token (latte.ops.distributions), or the
first quarter of the row left padding. The whole model is timed on its
token ids only (std1).

    python -m benchmarks.memory [--quick] [--rules key_norm,recall] [--model-rules key_norm]
        [--inputs std1,std10,std40,spike80,left-padding] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks import RESULTS
from latte import LatteConfig, LatteForCausalLM, reporting
from latte import bench as common
from latte.bench import MEMORY_RULES, Memory
from latte.ops import distributions as dists
from latte.ops import macchiato, macchiato_step

FULL = dict(T=2048, H=9, K=3, E=64, L=32, W=128, S=4, M=64)
QUICK = dict(T=48, H=4, K=2, E=8, L=4, W=8, S=2, M=4)
MODEL = dict(vocab_size=49152, num_layers=30, ffn_dim=1536)  # SmolLM2-135M's; width H * E
QUICK_MODEL = dict(vocab_size=64, num_layers=2, ffn_dim=64)
MODEL_RULES = tuple(r for r in MEMORY_RULES if r != "oracle")  # the oracle needs marks a model call does not take
PHASES = ("prefill", "decode")
PREFILL_TARGET, DECODE_TARGET = 0.8, 1.1  # issue 57: with / without memory, tokens/s and ms/step
INPUTS = ("std1", "std10", "std40", "spike80", "left-padding")  # kinds of layer input (_inputs)


def _rules(text: str, allowed=MEMORY_RULES, empty=False) -> list[str]:
    rules = [r for r in text.split(",") if r]
    bad = [r for r in rules if r not in allowed]
    if bad or not (rules or empty):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {allowed}, got {text!r}")
    return rules


def _model_rules(text: str) -> list[str]:
    return _rules(text, MODEL_RULES, empty=True)


def _input_kinds(text: str) -> list[str]:
    kinds = [k for k in text.split(",") if k]
    bad = [k for k in kinds if k not in INPUTS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {INPUTS}, got {text!r}")
    return list(dict.fromkeys(kinds))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    p.add_argument("--rules", type=_rules, default=list(MEMORY_RULES), help="selection rules (default all)")
    p.add_argument(
        "--model-rules", type=_model_rules, default=["key_norm"], help='rules timed on the whole model ("" for none)'
    )
    p.add_argument(
        "--inputs",
        type=_input_kinds,
        default=["std1"],
        help=f"kinds of layer input, of {','.join(INPUTS)} (default std1)",
    )
    args = p.parse_args(argv)
    args.shape = QUICK if args.quick else FULL
    args.dtype = "float32"
    return args


def _inputs(s: dict, kind: str = "std1"):
    """The same layer inputs for every rule: a, b, v, q, k, mark [B, T, ...]
    and mask [B, T] (None: no padding). `kind` (INPUTS): standard-normal;
    key logits b and keys k of std 10 or 40, or +80 on every 16th token
    (latte.ops.distributions; the keys' scores q . k / sqrt(E) then have
    that spread); or the first quarter of the row left padding."""
    g = torch.Generator().manual_seed(0)
    T, H, K, E, L = s["T"], s["H"], s["K"], s["E"], s["L"]
    a, b = torch.randn(1, T, H, L, generator=g), torch.randn(1, T, H, L, generator=g)
    v, q, k = (torch.randn(1, T, n, E, generator=g) for n in (K, H, K))
    mark = torch.rand(1, T, generator=g) < 0.05
    mask = None
    if kind == "left-padding":
        mask = torch.arange(T)[None] >= T // 4
    elif kind != "std1":
        b, k = dists.logits(b, kind), dists.logits(k, kind)
    return a, b, v, q, k, mark, mask


def _calls(s: dict, x, rule: str | None) -> dict:
    """(prefill, decode) zero-argument calls of the layer, with memory under
    `rule` or without (None). The decode call is one step from the state
    after the prefill of T - 1 tokens (the same state every call)."""
    a, b, v, q, k, mark, mask = x
    memory = None if rule is None else Memory(s["M"], rule, 0)
    kw = dict(window_size=s["W"], num_sinks=s["S"], memory=memory)
    m = {"memory_mark": mark} if rule == "oracle" else {}
    m.update({} if mask is None else {"mask": mask})
    _, st = macchiato(*(t[:, :-1] for t in (a, b, v, q, k)), output_final_state=True, **kw, **_cut(m))
    mt = {"memory_mark_t": mark[:, -1]} if rule == "oracle" else {}
    mt.update({} if mask is None else {"mask_t": mask[:, -1]})

    @torch.no_grad()
    def prefill():
        return macchiato(a, b, v, q, k, **kw, **m)

    @torch.no_grad()
    def decode():
        return macchiato_step(a[:, -1], b[:, -1], v[:, -1], q[:, -1], k[:, -1], st, **kw, **mt)

    return {"prefill": prefill, "decode": decode}


def _cut(m: dict) -> dict:
    return {name: t[:, :-1] for name, t in m.items()}


def _model_calls(s: dict, quick: bool, rule: str | None) -> dict:
    """_calls for the whole model (MODEL's sizes, random weights seeded alike)."""
    sizes = QUICK_MODEL if quick else MODEL
    memory = {} if rule is None else dict(memory_slots=s["M"], memory_rule=rule)
    torch.manual_seed(0)
    config = LatteConfig(
        mixer="macchiato",
        dim=s["H"] * s["E"],
        num_heads=s["H"],
        num_kv_heads=s["K"],
        latents_per_head=s["L"],
        window_size=s["W"],
        num_sinks=s["S"],
        max_position_embeddings=s["T"],
        **sizes,
        **memory,
    )
    model = LatteForCausalLM(config).eval()
    ids = torch.randint(0, sizes["vocab_size"], (1, s["T"]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        st = model(ids[:, :-1], use_cache=True).state

    @torch.no_grad()
    def prefill():
        return model(ids).logits

    @torch.no_grad()
    def decode():
        return model(ids[:, -1:], state=st, use_cache=True).logits

    return {"prefill": prefill, "decode": decode}


def _cpu_timed(fn):
    """fn with its calls' thread CPU time appended to fn.cpu_ms."""

    def call():
        t0 = time.thread_time()
        out = fn()
        call.cpu_ms.append((time.thread_time() - t0) * 1e3)
        return out

    call.cpu_ms = []
    return call


def _time_pair(s: dict, base: dict, mem: dict, rule: str, scope: str, args, rows: list, kind: str = "std1") -> None:
    """Both phases of one rule, without and with memory interleaved, into
    rows: wall time (common.time_interleaved) and, from the same calls, the
    thread's CPU time, which other jobs on a loaded machine inflate far
    less (the ratios the table reports; cpu_ms excludes the warm-up);
    kind: the inputs' kind (INPUTS), in every row."""
    for phase in PHASES:
        fns = {"none": _cpu_timed(base[phase]), rule: _cpu_timed(mem[phase])}
        times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
        for memory, t in times.items():
            cpu = fns[memory].cpu_ms[args.warmup :]
            t.update(cpu_median_ms=statistics.median(cpu), cpu_min_ms=min(cpu))
            per = s["T"] / (t["median_ms"] / 1e3) if phase == "prefill" else None
            cpu_per = s["T"] / (t["cpu_median_ms"] / 1e3) if phase == "prefill" else None
            row = {"scope": scope, "inputs": kind, "rule": rule, "memory": memory, "phase": phase, **t}
            row["tokens_per_s"] = per
            rows.append({**row, "cpu_tokens_per_s": cpu_per})
        ratio = times[rule]["median_ms"] / times["none"]["median_ms"]
        cpu_ratio = times[rule]["cpu_median_ms"] / times["none"]["cpu_median_ms"]
        pair = {"scope": scope, "inputs": kind, "rule": rule, "phase": phase}
        rows.append({**pair, "ratio_with_to_without": ratio, "cpu_ratio": cpu_ratio})
        msg = f"  {scope:5s} {kind:12s} {rule:9s} {phase:7s} without {times['none']['cpu_median_ms']:9.3f} CPU ms, "
        print(msg + f"ratio {cpu_ratio:.2f} (wall {ratio:.2f})", flush=True)


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    s, rows = args.shape, []
    for kind in args.inputs:
        x = _inputs(s, kind)
        for rule in args.rules:
            _time_pair(s, _calls(s, x, None), _calls(s, x, rule), rule, "layer", args, rows, kind)
    if args.model_rules:
        base = _model_calls(s, args.quick, None)
        for rule in args.model_rules:
            _time_pair(s, base, _model_calls(s, args.quick, rule), rule, "model", args, rows)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    config = {"device": "cpu", "dtype": args.dtype, "threads": args.threads, "quick": args.quick, **s}
    config.update(rules=args.rules, model_rules=args.model_rules, repeats=args.repeats, warmup=args.warmup)
    config["inputs"] = args.inputs
    config["model"] = QUICK_MODEL if args.quick else MODEL
    return {"benchmark": "memory", "machine": info, "config": config, "results": rows}


def _scope(r: dict) -> str:
    return r.get("scope", "layer")  # results written before the model scope hold layers only


def _kind(r: dict) -> str:
    return r.get("inputs", "std1")  # results written before --inputs: standard-normal inputs only


def _verdict(prefill: float, decode: float) -> str:
    """Issue 57's two targets on the CPU-time ratios: met or missed, each."""
    p = "met" if prefill >= PREFILL_TARGET else "missed"
    d = "met" if decode <= DECODE_TARGET else "missed"
    return f"prefill {p}, decode {d}"


def _table_rows(res: dict) -> list[list[str]]:
    """One row per (scope, inputs, rule) pair timed: the CPU-time figures,
    the wall-time ratios and the targets' verdict."""
    c = res["config"]
    cell = {(_scope(r), _kind(r), r["rule"], r.get("memory"), r["phase"]): r for r in res["results"]}
    pairs = [("layer", kind, rule) for kind in c.get("inputs", ["std1"]) for rule in c["rules"]]
    pairs += [("model", "std1", rule) for rule in c.get("model_rules", [])]
    rows = []
    for scope, kind, rule in pairs:
        p0, p1 = cell[(scope, kind, rule, "none", "prefill")], cell[(scope, kind, rule, rule, "prefill")]
        d0, d1 = cell[(scope, kind, rule, "none", "decode")], cell[(scope, kind, rule, rule, "decode")]
        cpu = "cpu_median_ms" if "cpu_median_ms" in p0 else "median_ms"  # older records: wall only
        wall = f"{p0['median_ms'] / p1['median_ms']:.2f}, {d1['median_ms'] / d0['median_ms']:.2f}"
        prefill, decode = p0[cpu] / p1[cpu], d1[cpu] / d0[cpu]
        rows.append(
            [scope, kind, rule, f"{c['T'] / p0[cpu] * 1e3:,.0f}", f"{c['T'] / p1[cpu] * 1e3:,.0f}"]
            + [f"{prefill:.2f}", f"{d0[cpu]:.3f}", f"{d1[cpu]:.3f}", f"{decode:.2f}", wall, _verdict(prefill, decode)]
        )
    return rows


def markdown(res: dict) -> str:
    m, c = res["machine"], res["config"]
    model = c.get("model", {})
    out = [
        f"# latte bench memory (cpu{', quick' if c['quick'] else ''})",
        "",
        f"{m['cpu_model']}, {m['threads']} threads, torch {m['torch']}, {c['dtype']}; one Macchiato layer, "
        f"T={c['T']} H={c['H']} K={c['K']} E={c['E']} latents/head={c['L']} W={c['W']} sinks={c['S']} "
        f"slots={c['M']}, and (scope model) the native macchiato model of {model.get('num_layers', '?')} such "
        f"layers, MLP {model.get('ffn_dim', '?')}, vocabulary {model.get('vocab_size', '?')}; median of "
        f"{c['repeats']} calls, without and with memory interleaved per rule; load avg "
        f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}. Times are the thread's CPU time "
        "(wall-time ratios in the second last column: on a loaded machine they measure the other jobs too). "
        f"Target (issue 57): decode <= {DECODE_TARGET}x, prefill tokens/s >= {PREFILL_TARGET}x without memory. "
        "Inputs: std1 standard-normal; std10, std40 the key logits b and the keys k of that std; spike80 "
        "+80 on every 16th token's; left-padding the first quarter of the row padding (the model: std1, "
        "its own token ids).",
        "",
    ]
    hdr = ["scope", "inputs", "rule", "prefill tok/s without", "with", "with/without", "decode ms without", "with"]
    hdr += ["with/without", "wall: prefill, decode", "targets"]
    return "\n".join(out + [reporting.md_table(hdr, _table_rows(res))]) + "\n"


def plot(res: dict, path) -> bool:
    """Median ms without and with memory per rule of the layer on the first
    kind of inputs (x: the rules' order, 1..n), one panel per phase."""
    c, panels = res["config"], {}
    kind = c.get("inputs", ["std1"])[0]
    xs = list(range(1, len(c["rules"]) + 1))
    for phase in PHASES:
        cell = {
            (r["rule"], r["memory"]): r["median_ms"]
            for r in res["results"]
            if r.get("phase") == phase and "memory" in r and _scope(r) == "layer" and _kind(r) == kind
        }
        panels[f"{phase}: median ms"] = {
            "without": (xs, [cell[(rule, "none")] for rule in c["rules"]]),
            "with": (xs, [cell[(rule, rule)] for rule in c["rules"]]),
        }
    rules = ", ".join(f"{i} {r}" for i, r in zip(xs, c["rules"]))
    title = f"latte bench memory, {kind} inputs"
    return common.plot_loglog(path, panels, xlabel=f"rule ({rules})", ylabel="ms", title=title)


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
