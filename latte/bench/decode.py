"""`latte bench decode`: per-token decoding latency and state size vs context
(docs/evaluation.md §2).

For each mixer (latte and macchiato decode from a constant-size recurrent
state, softmax from a growing KV cache; same model size, the paper's Table 6
preset) the context is grown in chunks THROUGH the state (prefill chunks of
`--prefill-chunk` tokens, so memory stays bounded) and the state reached at
each context of `--contexts` is kept. Then one greedy decoding step from each
kept state is timed `--tokens` times (after warm-up), the contexts
interleaved round by round; the median per context is reported with the
state's bytes. A context whose predicted prefill time exceeds
`--prefill-cap` seconds is skipped with the prediction as the reason
(per-token prefill cost grows linearly with the context for softmax, is
constant for the others).

With `--synthetic-state` no context is prefilled: each context's state is
the one a short prefill leaves (`SYNTHETIC_PROBE` tokens, enough to fill
every window), its position set to the context and every KV cache filled
to the context with random keys and values, all slots valid. A decoding
step's work depends on its state's shapes and the position, not on the
state's values, so this times the step at 128K in seconds rather than the
minutes a prefill takes; a context whose states would not fit in the
device's free memory (estimated from the KV caches' bytes per position) is
skipped with the estimate as the reason.

    python -m latte.bench.decode [--quick] [--threads 2] [--out bench-results]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from latte import reporting
from latte.arguments import int_at_least, int_list, name_list, number
from latte.layers import KVCache, state_nbytes
from latte.models import LatteConfig, LatteForCausalLM
from latte.models.config import MIXERS as CONFIG_MIXERS
from latte.models.modeling import LatteCache
from latte.models.static_decode import allocate, capture, decode_step, layer_windows
from latte.ops import set_backend

from . import common
from .device import DTYPES, add_device_args, check_device, device_info, resolve_device_args

FULL_CONTEXTS = [1024, 4096, 16384, 65536]
QUICK_CONTEXTS = [64, 256]
MIXERS = ("latte", "macchiato", "softmax")
WARMUP_TOKENS = 2  # untimed decode steps before the timed ones
SYNTHETIC_PROBE = 256  # tokens prefilled for a synthetic state's structure (>= every window)
MEMORY_SHARE = 0.8  # of the free memory, the most a synthetic context's estimate may take
SYNTHETIC = (
    "synthetic: the state a prefill of {probe} tokens leaves, its position set to the context and every "
    "KV cache filled to the context with random keys and values (all slots valid); a decoding step's "
    "work depends on the state's shapes and the position, not on its values"
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="latte bench decode", description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument(
        "--mixers", default=",".join(MIXERS), type=name_list(CONFIG_MIXERS), help="comma-separated LatteConfig mixers"
    )
    p.add_argument(
        "--contexts",
        default=None,
        type=int_list(low=1, increasing=True),
        help="comma-separated context lengths (default 1K,4K,16K,64K)",
    )
    p.add_argument("--tokens", type=int_at_least(5), default=None, help="decoded tokens timed per context (default 64)")
    p.add_argument("--prefill-chunk", type=int_at_least(1), default=1024, help="tokens per prefill forward")
    p.add_argument(
        "--prefill-cap",
        type=number("a number of seconds > 0", lambda v: v > 0),
        default=300.0,
        help="skip a context whose prefill would take longer than this (s)",
    )
    add_device_args(p)
    p.add_argument(
        "--backends",
        default=None,
        type=name_list(("torch", "fla")),
        help="latte.ops backends for the latte and macchiato mixers (default: torch on CPU, torch,fla on CUDA)",
    )
    p.add_argument(
        "--synthetic-state",
        action="store_true",
        help="no prefill: each context's state built at its shape and position (see the module docstring)",
    )
    args = p.parse_args(argv)
    resolve_device_args(p, args, cpu_dtypes=("float32",))
    args.backends = list(args.backends or (("torch",) if args.device == "cpu" else ("torch", "fla")))
    args.mixers = list(args.mixers)
    args.contexts = list(args.contexts or (QUICK_CONTEXTS if args.quick else FULL_CONTEXTS))
    if args.tokens is None:  # --tokens 0 is refused by its type, not read as the default
        args.tokens = 8 if args.quick else 64
    return args


def max_len(args) -> int:
    """Positions used: the longest context plus the positions the static
    step decodes from it (its capture's step, warm-up and timed steps)."""
    return max(args.contexts) + args.tokens + WARMUP_TOKENS + 2


def make_config(mixer: str, quick: bool, max_len: int):
    """Table 6 preset (tiny config in --quick), positions long enough for max_len."""

    if quick:
        return LatteConfig.tiny(mixer=mixer, max_position_embeddings=max(4096, max_len))
    # learned positions: the table's 512 is extended (untrained rows cost the same)
    return LatteConfig.paper_table6(mixer=mixer, max_position_embeddings=max_len)


@torch.inference_mode()
def bench_mixer(mixer: str, args, rows: list[dict], backend: str = "torch") -> None:
    """Appends one row per context to `rows` (kept if a later context fails).

    Phase 1 grows the context through the state and keeps the state reached
    at each context (a cache is a value: decoding from it leaves it as it
    is). Phase 2 times one greedy decoding step from each saved state, the
    contexts interleaved round by round, so drift on a shared machine falls
    on every context alike and the long/short ratio stays meaningful."""

    set_backend(backend)  # run() restores the default
    dev = getattr(args, "device", "cpu")
    label = mixer if backend == "torch" else f"{mixer}[{backend}]"
    cfg = make_config(mixer, args.quick, max_len(args))
    torch.manual_seed(0)
    model = LatteForCausalLM(cfg).eval().to(dev)
    amp = torch.autocast(dev, DTYPES[args.dtype], enabled=dev == "cuda" and args.dtype != "float32")
    gen = torch.Generator().manual_seed(0)
    if getattr(args, "synthetic_state", False):
        saved, recs = _synthetic_contexts(model, args, amp, gen, label)
    else:
        saved, recs = _prefill_contexts(model, args, amp, gen, label, quadratic=mixer == "softmax")
    tok = torch.randint(0, cfg.vocab_size, (1, 1), generator=gen).to(dev)
    _time_steps(model, tok, saved, recs, args, amp, label)
    _time_static_steps(model, tok, saved, recs, args, amp, label)
    rows += list(recs.values())
    rows += [
        {"mixer": label, "context": c, **common.skipped("a shorter context was already skipped")}
        for c in args.contexts
        if c not in recs
    ]


def _prefill_contexts(model, args, amp, gen, label: str, quadratic: bool) -> tuple[dict, dict]:
    """Phase 1: (state reached at each context, its record so far), the
    contexts in order; stops before a prefill predicted over the cap."""
    dev, vocab = getattr(args, "device", "cpu"), model.config.vocab_size
    _warm_prefill(model, min(args.prefill_chunk, args.contexts[0]), dev, amp)
    state, seen, per_token_prefill, last_avg = None, 0, None, 1.0
    saved, recs = {}, {}
    for ctx in args.contexts:
        rec = {"mixer": label, "context": ctx}
        new = ctx - seen
        if per_token_prefill is not None and new > 0:
            growth = (seen + ctx) / 2 / last_avg if quadratic else 1.0  # mean context ratio
            pred = per_token_prefill * growth * new
            if pred > args.prefill_cap:
                recs[ctx] = {
                    **rec,
                    **common.skipped(
                        f"prefill {seen}->{ctx} predicted {pred:.0f} s > {args.prefill_cap:g} s cap"
                        + (" (KV-cache attention: per-token cost grows with the context)" if quadratic else "")
                    ),
                }
                break  # longer contexts cost even more
        t0 = time.perf_counter()
        while seen < ctx:  # prefill through the state, chunk by chunk
            n = min(args.prefill_chunk, ctx - seen)
            ids = torch.randint(0, vocab, (1, n), generator=gen).to(dev)
            with amp:
                state = model(ids, state=state, use_cache=True).state
            seen += n
        prefill_s = time.perf_counter() - t0
        if new > 0:
            per_token_prefill, last_avg = prefill_s / new, (ctx - new + ctx) / 2
        saved[ctx] = state
        recs[ctx] = {**rec, "prefill_s": prefill_s, "prefill_tokens": new, "state_bytes": state_nbytes(state)}
        print(
            f"  {label:10s} ctx={ctx:6d} prefilled in {prefill_s:.1f} s, state "
            f"{recs[ctx]['state_bytes'] / 2**20:8.2f} MiB",
            flush=True,
        )
    return saved, recs


def free_bytes(dev: str) -> int:
    """Free memory of the device (CUDA: the driver's figure; CPU: available pages)."""
    if dev == "cuda":
        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _kv_bytes_per_position(layers) -> int:
    """Bytes a KV cache of the state holds per position (keys, values and mask)."""
    total = 0
    for s in layers:
        if isinstance(s, KVCache):
            total += sum(t[0, 0].numel() * t.element_size() * t.shape[0] for t in (s.k, s.v))
            total += s.mask.element_size() * s.mask.shape[0]
        elif isinstance(s, tuple) and hasattr(s, "_fields"):
            total += _kv_bytes_per_position([x for x in s if x is not None])
    return total


def synthetic_layer(state, ctx: int):
    """One layer's state at context ctx: every KV cache filled to ctx random
    keys and values of the same scale, all valid; anything else as it is."""
    if isinstance(state, KVCache):
        B, _, *rest = state.k.shape
        k, v = (
            torch.randn(B, ctx, *rest, device=t.device, dtype=t.dtype) * t.float().std() for t in (state.k, state.v)
        )
        return KVCache(k, v, state.mask.new_ones(B, ctx), None if state.pos is None else state.pos.new_full((B,), ctx))
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(synthetic_layer(s, ctx) for s in state))
    return state


def _synthetic_contexts(model, args, amp, gen, label: str) -> tuple[dict, dict]:
    """Phase 1 with --synthetic-state: per context, the probe's state at that
    context and position (SYNTHETIC), no prefill; a context whose states
    would not fit in MEMORY_SHARE of the free memory is skipped, saying why."""
    dev = getattr(args, "device", "cpu")
    ids = torch.randint(
        0, model.config.vocab_size, (1, min(SYNTHETIC_PROBE, model.config.max_position_embeddings)), generator=gen
    ).to(dev)
    with amp:
        probe = model(ids, use_cache=True).state
    per_pos, free, held = _kv_bytes_per_position(probe.layers), free_bytes(dev), 0
    saved, recs = {}, {}
    for ctx in args.contexts:
        rec = {"mixer": label, "context": ctx, "state": "synthetic"}
        need = held + 3 * per_pos * ctx  # this state, its static copy and one value step's copy
        if need > MEMORY_SHARE * free:
            why = f"states estimated at {need / 2**30:.1f} GiB > {MEMORY_SHARE:g} x {free / 2**30:.1f} GiB free"
            recs[ctx] = {**rec, **common.skipped(why + f" ({per_pos:,} bytes of KV cache per position)")}
            break  # longer contexts need more
        held += 2 * per_pos * ctx
        layers = [synthetic_layer(s, ctx) for s in probe.layers]
        saved[ctx] = state = LatteCache(layers, ctx, torch.full_like(probe.pos, ctx))
        recs[ctx] = {**rec, "prefill_s": 0.0, "prefill_tokens": 0, "state_bytes": state_nbytes(state)}
        print(f"  {label:10s} ctx={ctx:6d} synthetic state {recs[ctx]['state_bytes'] / 2**20:8.2f} MiB", flush=True)
    return saved, recs


def _warm_prefill(model, n: int, dev, amp) -> None:
    """Two untimed prefill chunks of n tokens, the first from no state and the
    second from its state, discarded: the kernels' first-call costs (fla's
    Triton compiles, about 2 s on an H200) would otherwise count as prefill
    time and skip every longer context by a predicted time they never take."""
    ids = torch.zeros(1, n, dtype=torch.long, device=dev)
    with amp:
        state = model(ids, use_cache=True).state
        model(ids, state=state, use_cache=True)


def _time_steps(model, tok, saved: dict, recs: dict, args, amp, label: str) -> None:
    """Phase 2: times one greedy step of `tok` from each saved state, round by
    round, into the contexts' records."""
    dev = getattr(args, "device", "cpu")
    times = {ctx: [] for ctx in saved}
    for i in range(args.tokens + WARMUP_TOKENS):
        for ctx, st in saved.items():
            t0 = time.perf_counter()
            with amp:
                out = model(tok, state=st, use_cache=True)
            out.logits[:, -1:].argmax(-1)  # the greedy choice belongs to the step
            if dev == "cuda":
                torch.cuda.synchronize()
            if i >= WARMUP_TOKENS:
                times[ctx].append((time.perf_counter() - t0) * 1e3)
    for ctx, ts in times.items():
        recs[ctx].update(
            {
                "median_ms": statistics.median(ts),
                "min_ms": min(ts),
                "tokens": len(ts),
                "times_ms": [round(t, 3) for t in ts],
            }
        )
        print(f"  {label:10s} ctx={ctx:6d} {recs[ctx]['median_ms']:8.2f} ms/token", flush=True)


def _static_steps(model, tok, saved: dict, args, amp) -> dict:
    """Per context: (the static decoding state allocated from the saved
    state, latte/models/static_decode.py; its greedy step, captured in a
    CUDA graph on CUDA), sized for the steps timed and the capture's warm-up."""

    def feed(t, layers, pos):
        out = model(t[:, None], state=LatteCache(layers, 0, pos), use_cache=True)
        return out.logits[:, -1], out.state.layers, out.state.pos

    windows = layer_windows([block.mixer for block in model.model.blocks])
    steps = {}
    for ctx, st in saved.items():
        state = allocate(st.layers, windows, st.pos, st.seen_tokens, args.tokens + WARMUP_TOKENS + 1)
        run = lambda t, state=state: decode_step(feed, state, t, lambda x: x.argmax(-1), None)  # noqa: E731
        with torch.no_grad(), amp:
            steps[ctx] = capture(run, tok[:, 0])[1]  # its warm-up is one step
    return steps


def _time_static_steps(model, tok, saved: dict, recs: dict, args, amp, label: str) -> None:
    """Phase 3: as phase 2, through the static step (static_* in the records)."""
    dev = getattr(args, "device", "cpu")
    steps = _static_steps(model, tok, saved, args, amp)
    times = {ctx: [] for ctx in saved}
    for i in range(args.tokens + WARMUP_TOKENS):
        for ctx, step in steps.items():
            t0 = time.perf_counter()
            with torch.no_grad(), amp:
                step(tok[:, 0])
            if dev == "cuda":
                torch.cuda.synchronize()
            if i >= WARMUP_TOKENS:
                times[ctx].append((time.perf_counter() - t0) * 1e3)
    for ctx, ts in times.items():
        recs[ctx].update({"static_median_ms": statistics.median(ts), "static_min_ms": min(ts)})
        recs[ctx]["static_captured"] = dev == "cuda"
        print(f"  {label:10s} ctx={ctx:6d} {recs[ctx]['static_median_ms']:8.2f} ms/token (static step)", flush=True)


def run(args) -> dict:
    check_device(args.device)
    common.set_threads(args.threads)
    info = {**reporting.machine_info(), **device_info(args.device)}
    rows, status = [], {}
    for mx, backend in [(m, b) for m in args.mixers for b in (args.backends if m != "softmax" else ["torch"])]:
        m = mx if backend == "torch" else f"{mx}[{backend}]"
        try:
            bench_mixer(mx, args, rows, backend)
            status[m] = "ok"
        except (ImportError, ValueError, RuntimeError) as e:  # model code missing or OOM
            status[m] = f"failed: {type(e).__name__}: {e}"
            done = {r["context"] for r in rows if r["mixer"] == m}
            rows += [{"mixer": m, "context": c, **common.skipped(status[m])} for c in args.contexts if c not in done]
        finally:
            set_backend(None)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    cfg = make_config(args.mixers[0], args.quick, max_len(args)) if args.mixers else None
    return {
        "benchmark": "decode",
        "machine": info,
        "config": {
            "threads": args.threads,
            "device": args.device,
            "dtype": args.dtype,
            "quick": args.quick,
            "contexts": args.contexts,
            "tokens": args.tokens,
            "warmup_tokens": WARMUP_TOKENS,
            "prefill_chunk": args.prefill_chunk,
            "prefill_cap_s": args.prefill_cap,
            "batch": 1,
            "mixers": list(status),
            "backends": args.backends,
            "state": SYNTHETIC.format(probe=SYNTHETIC_PROBE)
            if getattr(args, "synthetic_state", False)
            else "prefilled: the context fed through the state in chunks of prefill_chunk tokens",
            "model": cfg.to_dict() if cfg is not None else None,
            "timing": "wall clock of one LatteForCausalLM.forward of 1 token with use_cache from the state "
            "saved at each context (greedy next token); contexts interleaved round by round. static_*: "
            "the same through the static decoding step (latte/models/static_decode.py) on a state "
            "allocated once per context, captured in a CUDA graph and replayed on CUDA (static_captured)",
        },
        "mixers": status,
        "results": rows,
        "ratios": ratios(rows),
    }


def ratios(rows) -> dict:
    """softmax / latte (and / macchiato) per-token latency and state bytes at
    each context; and per mixer, latency at the longest measured context over
    the shortest (1.0 = flat in the context)."""
    ok = {(r["mixer"], r["context"]): r for r in rows if not r.get("skipped")}
    out = {"longest/shortest median_ms": {}}
    for mx in dict.fromkeys(m for m, _ in ok):
        cs = sorted(c for m, c in ok if m == mx)
        out["longest/shortest median_ms"][mx] = ok[(mx, cs[-1])]["median_ms"] / ok[(mx, cs[0])]["median_ms"]
    for other in ("latte", "macchiato"):
        for key in ("median_ms", "state_bytes"):
            out[f"softmax/{other} {key}"] = {
                str(c): ok[("softmax", c)][key] / ok[(other, c)][key]
                for (m, c) in ok
                if m == "softmax" and (other, c) in ok
            }
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    ctxs, mixers = res["config"]["contexts"], res["config"]["mixers"]
    cell = {(r["mixer"], r["context"]): r for r in res["results"]}

    def val(mx, c, key, scale=1.0):
        r = cell.get((mx, c))
        return "skip" if r is None or r.get("skipped") else r[key] * scale

    ratio = res["ratios"].get("softmax/latte median_ms", {})
    hdr = ["context"] + [f"{mx} ms/token" for mx in mixers] + ["softmax/latte"] + [f"{mx} state KiB" for mx in mixers]
    rows = [
        [str(c)]
        + [val(mx, c, "median_ms") for mx in mixers]
        + [ratio.get(str(c), "-")]
        + [val(mx, c, "state_bytes", 1 / 1024) for mx in mixers]
        for c in ctxs
    ]
    flat = ", ".join(f"{mx} {v:.2f}x" for mx, v in res["ratios"]["longest/shortest median_ms"].items())
    out = [
        f"# latte bench decode ({'quick, tiny model' if res['config']['quick'] else 'Table 6 preset'})",
        "",
        f"{m.get('gpu') or m['cpu_model'] + ', ' + str(m['threads']) + ' threads'}, torch {m['torch']}, "
        f"{res['config'].get('dtype', 'float32')}, batch 1; median of "
        f"{res['config']['tokens']} one-token steps from the state at each context, contexts interleaved "
        f"round by round. Latency at the longest over the shortest "
        f"measured context: {flat}."
        + (f" State: {res['config']['state']}." if res["config"].get("state", "").startswith("synthetic") else ""),
        "",
        reporting.md_table(hdr, rows),
    ]
    skips = [f"- {r['mixer']} @ {r['context']}: {r['reason']}" for r in res["results"] if r.get("skipped")]
    return "\n".join(out + ([""] + skips if skips else [])) + "\n"


def plot(res: dict, path) -> bool:
    series = {}
    for mx in res["config"]["mixers"]:
        pts = [(r["context"], r["median_ms"]) for r in res["results"] if r["mixer"] == mx and not r.get("skipped")]
        series[mx] = ([c for c, _ in pts], [v for _, v in pts])
    m = res["machine"]
    title = f"latte bench decode: {m.get('gpu') or m['cpu_model'] + ', ' + str(m['threads']) + ' threads'}"
    return common.plot_loglog(
        path, {"per-token decode latency": series}, xlabel="context (tokens)", ylabel="median ms / token", title=title
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    name = "decode" if args.device == "cpu" else f"decode-{args.device}"
    common.claim_outputs(args, "decode", name)  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, name, res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
