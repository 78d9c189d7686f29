"""`python -m benchmarks.distill`: the up-training objective's head, whole logits
against chunks (latte/convert/distill.py).

Conversion's end-to-end objective (KL to the original plus next-token CE)
needs the LM head applied to the final hidden states of both models. The
"full-logits" provider builds the whole [N, vocab] logits of student and
teacher and lets autograd differentiate them (`full_logits_objective`, the
path a trainable head takes); "chunked" is `chunked_objective`, which applies
the frozen head 256 rows at a time and forms the hidden states' gradient in
the forward pass. Each call is one forward and backward to the student's
hidden states, at the shape of Gemma 3 270M (hidden 640, vocabulary 262,144,
no final soft-cap) for N target tokens. Both providers are timed in
interleaved rounds; the peak memory of one call comes from a fresh process
(latte.bench.common.memory_points); the loss and gradient differences between
the two are recorded. The work does not depend on the logits' values
(softmax and log-sum-exp over the whole vocabulary); hidden states and head
are drawn so that the logits spread with a standard deviation of about 3.

    python -m benchmarks.distill [--quick] [--threads 2] [--tokens 256,512,1024] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import torch
from torch import nn

from benchmarks import RESULTS
from latte import bench as common
from latte import reporting
from latte.arguments import int_list
from latte.bench import chunked_objective, full_logits_objective, head_logits

PROVIDERS = ("full-logits", "chunked")
FULL = {"hidden": 640, "vocab": 262_144, "tokens": [256, 512, 1024]}  # Gemma 3 270M
QUICK = {"hidden": 32, "vocab": 1000, "tokens": [48]}
LOGIT_STD = 3.0


class _Head(nn.Module):
    """The two things `head_logits` reads from a causal LM: its output
    embeddings and its config (final_logit_softcapping)."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight.data = torch.randn(vocab, hidden, generator=g) * (LOGIT_STD / hidden**0.5)
        self.lm_head.weight.requires_grad_(False)
        self.config = SimpleNamespace(final_logit_softcapping=None)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def _inputs(tokens: int, hidden: int, vocab: int):
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(tokens, hidden, generator=g)
    student = (teacher + 0.3 * torch.randn(tokens, hidden, generator=g)).requires_grad_(True)
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    return student, teacher, labels


def build(provider: str, tokens: int, hidden: int, vocab: int):
    """A zero-argument call: the objective's forward and backward, returning
    (loss, gradient with respect to the student's hidden states)."""
    if provider not in PROVIDERS:
        raise ValueError(f"provider: expected one of {PROVIDERS}, got {provider!r}")
    head = _Head(hidden, vocab)
    student, teacher, labels = _inputs(tokens, hidden, vocab)

    def call():
        student.grad = None
        if provider == "chunked":
            loss = chunked_objective(head, student, teacher, labels)
        else:
            with torch.no_grad():
                teacher_logits = head_logits(head, teacher)
            loss = full_logits_objective(head_logits(head, student), teacher_logits, labels)
        loss.backward()
        return loss.detach(), student.grad

    return call


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.distill", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    p.add_argument("--tokens", default=None, type=int_list(low=1), help="comma-separated N (default 256,512,1024)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory worker")
    args = p.parse_args(argv)
    shape = QUICK if args.quick else FULL
    args.hidden, args.vocab = shape["hidden"], shape["vocab"]
    args.tokens = list(args.tokens or shape["tokens"])
    return args


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    # memory first, in a fresh process, while this one is small: the full
    # logits' peak at Gemma's vocabulary is many GB, and this process keeps
    # its freed heap (latte.allocator)
    peaks = {}
    if not args.no_memory:
        points = [
            {"provider": p, "tokens": n, "hidden": args.hidden, "vocab": args.vocab}
            for n in args.tokens
            for p in PROVIDERS
        ]
        got = common.memory_points("benchmarks.distill:build", points, args.threads, shrink=("tokens",))
        peaks = {(m["provider"], m["tokens"]): m for m in got}
    rows = []
    for n in args.tokens:
        calls = {p: build(p, n, args.hidden, args.vocab) for p in PROVIDERS}
        (loss_f, grad_f), (loss_c, grad_c) = (calls[p]() for p in PROVIDERS)
        diff = {
            "loss_rel_diff": abs(float(loss_c) - float(loss_f)) / abs(float(loss_f)),
            "grad_max_abs_diff": (grad_c - grad_f).abs().max().item(),
            "grad_max_abs": grad_f.abs().max().item(),
        }
        times = common.time_interleaved(calls, repeats=args.repeats, warmup=args.warmup)
        for p in PROVIDERS:
            m = peaks.get((p, n), {})
            mem = {"peak_mb": m.get("peak_mb"), **({"memory_note": m["note"]} if m.get("note") else {})}
            rows.append({"provider": p, "tokens": n, **times[p], **mem, **(diff if p == "chunked" else {})})
            print(f"  {p:12s} N={n:6d} {times[p]['median_ms']:10.1f} ms", flush=True)
        del calls
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "distill",
        "machine": info,
        "config": {
            "device": "cpu",
            "dtype": "float32",
            "threads": args.threads,
            "quick": args.quick,
            "hidden": args.hidden,
            "vocab": args.vocab,
            "tokens": args.tokens,
            "chunk": 256,
            "logit_std": LOGIT_STD,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "providers": list(PROVIDERS),
            "memory": not args.no_memory,
        },
        "results": rows,
    }


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["provider"], r["tokens"]): r for r in res["results"]}

    def mb(r):
        return "-" if r.get("peak_mb") is None else f"{r['peak_mb']:,.0f}"

    rows = []
    for n in cfg["tokens"]:
        f, c = cell[("full-logits", n)], cell[("chunked", n)]
        rows.append(
            [
                str(n),
                f["median_ms"],
                c["median_ms"],
                f["median_ms"] / c["median_ms"],
                mb(f),
                mb(c),
                f"{c['loss_rel_diff']:.1e}",
                f"{c['grad_max_abs_diff'] / c['grad_max_abs']:.1e}",
            ]
        )
    hdr = [
        "N tokens",
        "full-logits ms",
        "chunked ms",
        "full/chunked",
        "full-logits peak MiB",
        "chunked peak MiB",
        "loss rel. diff",
        "grad max diff / max",
    ]
    where = f"{m['cpu_model']}, {m['threads']} threads, torch {m['torch']}, {cfg['dtype']}"
    shape = f"hidden {cfg['hidden']}, vocabulary {cfg['vocab']:,}, chunks of {cfg['chunk']} rows"
    load = f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}"
    head = (
        f"{where}; {shape}; one forward+backward of the objective (KL + CE) to the student's hidden states; "
        f"median ms of {cfg['repeats']} calls, providers interleaved; peak MiB: the resident memory one call "
        f"adds, in a fresh process; load avg {load}."
    )
    title = f"# latte bench distill (cpu{', quick' if cfg['quick'] else ''})"
    return "\n".join([title, "", head, "", reporting.md_table(hdr, rows)]) + "\n"


def plot(res: dict, path) -> bool:
    panels = {"time (ms)": {}, "peak memory (MiB)": {}}
    for p in res["config"]["providers"]:
        pts = [r for r in res["results"] if r["provider"] == p]
        panels["time (ms)"][p] = ([r["tokens"] for r in pts], [r["median_ms"] for r in pts])
        mem = [r for r in pts if r.get("peak_mb")]
        panels["peak memory (MiB)"][p] = ([r["tokens"] for r in mem], [r["peak_mb"] for r in mem])
    return common.plot_loglog(
        path,
        panels,
        xlabel="N target tokens",
        ylabel="",
        title=f"latte bench distill (vocab {res['config']['vocab']:,})",
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.claim_outputs(args, "distill", "distill")  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, "distill", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.distill", main, sys.argv[1:]))
