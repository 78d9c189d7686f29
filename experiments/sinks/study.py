"""`python -m experiments.sinks`: how many attention sinks conversion
keeps by default (ConversionConfig.num_sinks, docs/conversion.md §1).

Training-free: the shipped base (SmolLM2-135M-Instruct) converted with beta
at its initial value IS the window + k sinks model (docs/math.md §4.1,
tested), so its per-token loss on held-out text measures what keeping the
first k tokens visible is worth before any up-training. For each k in
--sinks and for the original (full attention), per held-out play and
held-out essay (latte/data/heldout.py, the longest --documents of each,
read to the largest context): perplexity over the first C tokens at each
context C, and its ratio to the original's on the same tokens. One cell per
(model, document), resumable.

    python -m experiments.sinks --quick            # tiny stand-in model, seconds (the test)
    python -m experiments.sinks --threads 1 --readme results/README.md   # results/convert-sinks
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

from experiments.common.results import Sweep, check_readme, claim_results, claim_work, provenance, write_results
from latte.arguments import checked, int_at_least, int_list
from latte.data import eval_essays, eval_plays
from latte.eval import converted_nll, original_nll

SINKS = (0, 1, 4, 8)
CONTEXTS = (1024, 2048)


# The defaults of the options --quick changes; an option given explicitly wins over either.
FULL = {"sinks": ",".join(map(str, SINKS)), "contexts": ",".join(map(str, CONTEXTS)), "window": 128}
FULL.update(documents=4, threads=2)
QUICK = {"sinks": "0,2", "contexts": "32,64", "window": 8, "documents": 2, "threads": 1}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.sinks", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--sinks", default=None, type=checked(int_list(low=0)), help="numbers of sinks compared (0,1,4,8)")
    p.add_argument(
        "--contexts", default=None, type=checked(int_list(low=2)), help="contexts (tokens) reported (1024,2048)"
    )
    p.add_argument("--window", type=int_at_least(1), default=None, help="window size (the shipped config's: 128)")
    p.add_argument(
        "--documents", type=int_at_least(1), default=None, help="held-out plays and essays each (longest first; 4)"
    )
    p.add_argument("--runs", default="runs/convert-sinks", help="folder of the sweep cells")
    p.add_argument("--out", default=None, help="default results/convert-sinks (--quick: inside --runs)")
    p.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads (2)")
    p.add_argument("--readme", default=None, help="replace its results:convert-sinks section (results/README.md)")
    p.add_argument(
        "--quick", action="store_true", help="a tiny random Llama and byte tokens, seconds (explicit options are kept)"
    )
    a = p.parse_args(argv)
    for name, value in (QUICK if a.quick else FULL).items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    return a


def load_model(a):
    """(converted model at beta's initial value, encode: str -> list[int])."""
    # optional dependency: latte.convert imports transformers (extra "hf")
    from latte.convert import ConversionConfig, convert, convert_pretrained

    # latents carry exactly no weight at beta_init: one per head keeps their cost out of the way
    conversion = ConversionConfig(window_size=a.window, num_sinks=0, latents_per_head=1, qk_mixer="none")
    if a.quick:
        import transformers as tf

        torch.manual_seed(0)
        cfg = tf.LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        model = convert(tf.LlamaForCausalLM(cfg), conversion)
        return model.eval(), lambda text: list(text.encode("utf-8"))
    from transformers import AutoTokenizer

    from latte.convert import resolve_base  # optional dependency: transformers

    folder, gguf = resolve_base("smollm2")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    model = convert_pretrained(folder, conversion, gguf_file=gguf)
    return model.eval(), lambda text: tok(text, add_special_tokens=False).input_ids


def documents(encode, n: int, max_context: int) -> dict[str, torch.Tensor]:
    """ "source/name" -> ids [<= max_context + 1]: the n longest held-out plays and essays."""
    out = {}
    for source, docs in (("plays", eval_plays()), ("essays", eval_essays())):
        ids = [(d.name, encode(d.text)) for d in docs]
        for name, x in sorted(ids, key=lambda p: -len(p[1]))[:n]:
            out[f"{source}/{name}"] = torch.tensor(x[: max_context + 1])
    return out


def cell_fn(model, docs):
    def run(cell: dict) -> dict:
        load0, ids = os.getloadavg()[0], docs[cell["document"]]
        if cell["model"] == "original":
            res = original_nll(model, ids)
        else:
            with model.as_sliding_window(num_sinks=cell["sinks"]):
                res = converted_nll(model, ids, contexts=())
        nll = ",".join(f"{x:.5f}" for x in res.nll.tolist())
        return {"tokens": int(res.nll.shape[0]), "wall_s": round(res.wall_s, 1), "load": round(load0, 2), "nll": nll}

    return run


def _label(cell: dict) -> str:
    return "original" if cell["model"] == "original" else f"window+{cell['sinks']} sinks"


def _ppl(cells: list[dict], label: str, docs: list[str], ctx: int) -> float | None:
    """Perplexity of one model over the first ctx targets of docs (None if a cell is missing)."""
    losses = [
        torch.tensor([float(x) for x in c["nll"].split(",")[:ctx]], dtype=torch.float64)
        for c in cells
        if _label(c) == label and c["document"] in docs
    ]
    return math.exp(float(torch.cat(losses).mean())) if len(losses) == len(docs) else None


def records(cells: list[dict], contexts) -> list[dict]:
    """Per (source, model, context): perplexity over the first C tokens of
    every document with at least C targets, and the ratio to the original's."""
    out = []
    order = sorted({(c.get("sinks", -1), _label(c)) for c in cells})  # the original first, then by k
    for source in ("plays", "essays"):
        mine = [c for c in cells if c["document"].startswith(source + "/")]
        for ctx in contexts:
            docs = sorted({c["document"] for c in mine if c["tokens"] >= ctx})
            if not docs:
                continue
            orig = _ppl(mine, "original", docs, ctx)
            for k, label in order:
                value = _ppl(mine, label, docs, ctx)
                out.append(
                    {
                        "source": source,
                        "model": label,
                        "sinks": None if k < 0 else k,
                        "context": ctx,
                        "documents": len(docs),
                        "tokens": ctx * len(docs),
                        "ppl": value,
                        "ratio_to_original": value / orig if value and orig else None,
                    }
                )
    return out


def table(recs: list[dict], contexts) -> str:
    cols = [
        (s, c)
        for s in ("plays", "essays")
        for c in contexts
        if any(r["source"] == s and r["context"] == c for r in recs)
    ]
    head = "| model | " + " | ".join(f"{s} {c:,} ({_docs(recs, s, c)} docs)" for s, c in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for model in dict.fromkeys(r["model"] for r in recs):
        cells = []
        for s, c in cols:
            r = next((r for r in recs if r["model"] == model and r["source"] == s and r["context"] == c), None)
            ok = r and r["ppl"] is not None
            cells.append(f"{r['ppl']:.2f} ({r['ratio_to_original']:.2f}x)" if ok else "")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _docs(recs, source, ctx):
    return next(r["documents"] for r in recs if r["source"] == source and r["context"] == ctx)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    started = time.time()
    check_readme(a.readme, ["convert-sinks"])
    a.out = a.out or (str(Path(a.runs) / "results") if a.quick else "results/convert-sinks")
    claim_results(a.out, "convert-sinks", create=False)  # before any work: the one write rule (latte/guard.py)
    claim_work(a.runs, "convert-sinks", "--runs", create=True)
    torch.set_num_threads(a.threads)
    sinks = [int(k) for k in a.sinks.split(",")]
    contexts = sorted(int(c) for c in a.contexts.split(","))
    model, encode = load_model(a)
    docs = documents(encode, a.documents, contexts[-1])
    cells = [{"model": "original", "document": d} for d in docs]
    cells += [{"model": "window", "sinks": k, "window": a.window, "document": d} for k in sinks for d in docs]
    # what a cell's loss depends on beyond its fields: the model and how far the documents are read
    ref = getattr(model.config, "base_weights", None) or {}  # the base's files, by sha256 (cells.py)
    protocol = {
        "base": "tiny random Llama" if a.quick else "smollm2",
        "max_context": contexts[-1],
        "inputs": {"base": ref.get("sha256", "random weights, seed 0")},
    }
    sweep = Sweep(a.runs, cells, protocol=protocol, fields=("nll", "tokens", "wall_s", "load"), folder_flag="--runs")
    reused = len(cells) - len(sweep.pending())
    with torch.no_grad():
        sweep.run(cell_fn(model, docs), desc="convert-sinks")
    done = sweep.records()
    recs = records(done, contexts)
    loads = [c["load"] for c in done]
    note = (
        f"\n\nPerplexity over the first C tokens (ratio to the original on the same tokens); window {a.window}, "
        f"beta at its initial value (exactly the window + k sinks model); the sinks are each document's first "
        f"tokens (no BOS is added). Documents (the longest held-out of each kind): {', '.join(docs)}. "
        f"Cells: {len(done)}, {sum(c['wall_s'] for c in done):,.0f} s in all, {a.threads} thread(s), 1-min load "
        f"average {min(loads):.1f}-{max(loads):.1f} at their starts"
        + (f"; {reused} were reused from an earlier invocation (the wall time above is this one's)." if reused else ".")
    )
    run = provenance("convert-sinks", argv, started, threads=a.threads)
    write_results(a.out, "convert-sinks", recs, table(recs, contexts) + note, run, readme=a.readme)
    print(table(recs, contexts))
    return 0
