"""The generated parts of the repository's three READMEs, from its committed results files.

    python tools/readme_tables.py           # rewrite them
    python tools/readme_tables.py --check   # exit 1, naming each file that differs

- README.md, between `<!-- headline:start -->` and `<!-- headline:end -->`: the
  headline table, every figure read from results/NAME/results.json or
  benchmarks/results/NAME.json by the rows of ROWS below. Adding or changing a row is
  one entry there.
- results/README.md: an index of results/*/ and every section `results:NAME`,
  exactly as `python -m experiments.X ... --readme results/README.md` writes it from
  results/NAME/results.md.
- benchmarks/README.md: the same for benchmarks/results/NAME.md and `latte bench ...
  --out benchmarks/results --readme benchmarks/README.md`.

A script here rather than a `latte` command: it reads the repository's
results/ and benchmarks/ folders, which an installed wheel does not have.
tests/test_readme.py runs the check, so a README that disagrees with the
committed files fails CI.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's latte, also when run from elsewhere

from experiments.common.results import readme_body  # noqa: E402
from latte.reporting import update_readme  # noqa: E402

HEADLINE = ("<!-- headline:start -->", "<!-- headline:end -->")
INDEX = ("<!-- index:start -->", "<!-- index:end -->")
# the benchmarks whose --readme section ends with their plot (latte/bench/ops.py: image_in_readme=True)
IMAGE_IN_README = {"ops"}


class Files:
    """The committed results files under one checkout (ROOT, or a copy in a test)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[str, object] = {}

    def load(self, rel: str):
        if rel not in self._cache:
            path = self.root / rel
            if not path.is_file():
                raise ValueError(f"{rel}: no such file (a headline row reads it)")
            self._cache[rel] = json.loads(path.read_text())
        return self._cache[rel]

    def records(self, rel: str) -> list[dict]:
        """results.json is a list of flat records; a benchmark's JSON keeps them under "results"."""
        data = self.load(rel)
        return data if isinstance(data, list) else data["results"]

    def where(self, rel: str, **match) -> list[dict]:
        found = [r for r in self.records(rel) if all(r.get(k) == v for k, v in match.items())]
        if not found:
            raise ValueError(f"{rel}: no record with {match}")
        return found

    def one(self, rel: str, field: str, **match):
        found = self.where(rel, **match)
        if len(found) != 1:
            raise ValueError(f"{rel}: {len(found)} records with {match}, expected one")
        return found[0][field]

    def best(self, rel: str, field: str, **match) -> float:
        """The highest `field` of the matching records (e.g. the best learning rate of a cell)."""
        return max(r[field] for r in self.where(rel, **match))

    def seeds(self, rel: str, field: str, digits: int = 1, **match) -> str:
        """mean ± sample std over the matching records (seeds), as the results tables give it."""
        xs = [r[field] for r in self.where(rel, **match)]
        return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"

    def mean(self, rel: str, field: str, **match) -> float:
        return statistics.mean(r[field] for r in self.where(rel, **match))


@dataclass(frozen=True)
class Row:
    claim: str
    figure: Callable[[Files], str]  # reads the committed files, returns the table cell
    source: str  # a file under results/ or benchmarks/, linked from the table


BENCH_RESULTS = "benchmarks/results"  # the benchmarks' committed files (benchmarks/README.md indexes them)
OPS, DECODE = (f"{BENCH_RESULTS}/{n}.json" for n in ("ops", "decode"))
OPS_CUDA = "benchmarks/cuda/ops-cuda-bfloat16.json"
LM, EXTRA, MQAR, CONV = (
    f"results/{n}/results.json" for n in ("lm_variants", "lm_variants/extrapolation", "mqar", "convert")
)
# the shipped recipe's 1M-token model (results/convert: the first recipe's, whose decoding row is kept: same shapes)
SHIPPED, SHIPPED_TASKS, SHIPPED_RETRIEVAL = (
    f"results/{n}/results.json" for n in ("convert-smollm2", "convert-smollm2-tasks", "convert-smollm2-retrieval")
)
LONG_EXTRA = "results/lm_variants_long/extrapolation/results.json"


def _size(n_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes / 2**10:,.0f} KiB"


# The figures, one function per row: each reads the committed files through `f`
# and returns one short cell (at most CELL characters; the nuance lives in the
# README's "Status and limits").


def ops_vs_sdpa(f: Files) -> str:
    fb = f.load(OPS)["ratios"]["sdpa/latte fwdbwd"]
    gpu = f.load(OPS_CUDA)["ratios"]["fwdbwd"]
    on_gpu = ", ".join(f"{gpu[T]['sdpa/latte-fla']:.2f}x at {int(T) // 1024}K" for T in ("4096", "16384", "65536"))
    return f"SDPA takes {fb['512']:.1f}x Latte's time at T = 512, {fb['16384']:.1f}x at 16K; on the H200 {on_gpu}"


def decode(f: Files) -> str:
    def ms(mixer: str, context: int) -> str:
        return f"{f.one(DECODE, 'median_ms', mixer=mixer, context=context):.1f} ms"

    def state(mixer: str, context: int) -> str:
        return _size(f.one(DECODE, "state_bytes", mixer=mixer, context=context))

    return (
        f"Latte {ms('latte', 1024)} at 1K context, {ms('latte', 65536)} at 64K, state {state('latte', 65536)}; "
        f"softmax {ms('softmax', 16384)}, KV cache {state('softmax', 16384)} at 16K"
    )


def lm_perplexity(f: Files) -> str:
    variants = sorted({r["variant"] for r in f.records(LM)})
    latte = min((v for v in variants if v.startswith("latte")), key=lambda v: f.mean(LM, "val_ppl", variant=v))
    names = (("macchiato", "Macchiato"), ("softmax", "softmax"), ("swa", "window"), (latte, "Latte"))
    return ", ".join(f"{name} {f.seeds(LM, 'val_ppl', variant=v)}" for v, name in (*names, ("linear", "linear")))


def extrapolation(f: Files) -> str:
    def ratios(rel: str) -> dict[str, float]:  # mean ppl over seeds at 16x / at 1x, all positions
        return {
            v: f.mean(rel, "ppl", variant=v, multiple=16, bucket="all")
            / f.mean(rel, "ppl", variant=v, multiple=1, bucket="all")
            for v in sorted({r["variant"] for r in f.records(rel)})
        }

    def line(rel: str, names: bool) -> str:
        r = ratios(rel)
        latte = [x for v, x in r.items() if v.startswith("latte")]
        m, lt, s = ("Macchiato ", "Latte ", "softmax ") if names else ("", "", "")
        return f"{m}{r['macchiato']:.2f}, {lt}{min(latte):.2f}-{max(latte):.2f}, {s}{r['softmax']:.2f}"

    return f"300 steps: {line(EXTRA, True)}; 3,000 steps: {line(LONG_EXTRA, False)}"


def mqar(f: Files) -> str:
    def acc(model: str, T: int, **match) -> str:  # seed 0 at the best learning rate of the cell
        return f"{f.best(MQAR, 'accuracy', model=model, dim=64, seq_len=T, seed=0, **match):.3f}"

    def seeds(model: str, **match) -> tuple[str, int]:  # the mean over every finished seed at lr 3e-3, T = 256
        cell = dict(model=model, dim=64, seq_len=256, lr=0.003, max_epochs=3, **match)
        xs = [r["accuracy"] for r in f.where(MQAR, **cell) if not r.get("incomplete")]
        return f"{statistics.mean(xs):.3f}", len(xs)

    pairs = "; ".join(
        f"T = {T}: {acc('latte-conv', T, num_latents=64)} vs {acc('linear-conv', T)}" for T in (64, 128, 256)
    )
    (latte, n), (linear, m) = seeds("latte-conv", num_latents=64), seeds("linear-conv")
    return f"{pairs}, over {n if n == m else f'{n} vs {m}'} seeds {latte} vs {linear}"


def conversion_perplexity(f: Files) -> str:
    def ppl(corpus: str, model: str, context: int) -> float:
        return f.one(SHIPPED, "ppl", corpus=corpus, model=model, context=context)

    def span(corpus: str, model: str) -> str:
        r = [ppl(corpus, model, c) / ppl(corpus, "original", c) for c in (1024, 2048, 4096, 8192)]
        return f"{min(r):.2f}-{max(r):.2f}x"

    return (
        f"over the original's at 1K-8K: essays {span('essays', 'converted')}, plays {span('plays', 'converted')}; "
        f"window + sinks {span('essays', 'window+sinks')}, {span('plays', 'window+sinks')}"
    )


def conversion_decode(f: Files) -> str:
    def at(model: str, field: str) -> float:
        return f.one(CONV, field, corpus="plays", model=model, context=32768)

    return (
        f"converted {at('converted', 'decode_ms_per_token'):.0f} ms, state {_size(at('converted', 'state_bytes'))}; "
        f"original {at('original', 'decode_ms_per_token'):.0f} ms, KV cache {_size(at('original', 'state_bytes'))}"
    )


def conversion_tasks_retrieval(f: Files) -> str:
    def average(model: str) -> float:
        rows = f.where(SHIPPED_TASKS, model=model)
        # acc_norm where lm-eval defines one for the task, else acc (the metric latte eval's tasks suite reports)
        return 100 * statistics.mean(r["acc_norm" if "acc_norm" in r else "acc"] for r in rows)

    def beyond(model: str) -> str:
        rows = f.where(SHIPPED_RETRIEVAL, model=model)
        return f"{sum(r['found_beyond'] for r in rows)}/{sum(r['beyond_window'] for r in rows)}"

    tasks = len(f.where(SHIPPED_TASKS, model="original"))
    return (
        f"{tasks} tasks: converted {average('converted'):.1f}, original {average('original'):.1f}; needles beyond "
        f"the window: converted {beyond('converted')}, window + sinks {beyond('window+sinks')}, "
        f"original {beyond('original')}"
    )


# The headline table, one row per entry (at most MAX_ROWS): what a sceptical
# reader asks first, each linked to the file that holds the full table, its
# command, machine and load.
ROWS = [
    Row(
        "Causal Latte vs PyTorch SDPA, one layer, forward+backward: CPU (fp32), H200 (fla vs FlashAttention, bf16)",
        ops_vs_sdpa,
        "benchmarks/README.md",
    ),
    Row(
        "Decoding one token, the paper's Table 6 model (8 layers, width 512), CPU", decode, f"{BENCH_RESULTS}/decode.md"
    ),
    Row(
        "Perplexity, 7 mixers on one recipe (2.7M parameters, 1.2M Shakespeare tokens, 3 seeds; Latte: best qk mixer)",
        lm_perplexity,
        "results/README.md",
    ),
    Row(
        "Perplexity at 16x the training length over 1x, the same runs and 3,000-step ones (Latte: range of qk mixers)",
        extrapolation,
        "results/README.md",
    ),
    Row(
        "Recall (MQAR) at equal state, Latte vs linear attention, both with a short convolution (seed 0)",
        mqar,
        "results/mqar/results.md",
    ),
    Row(
        "SmolLM2-135M converted to Macchiato (shipped recipe, 1M tokens): held-out perplexity "
        "(window + sinks: untrained)",
        conversion_perplexity,
        "results/convert-smollm2/results.md",
    ),
    Row(
        "The converted SmolLM2: zero-shot accuracy (100 examples a task), RULER-style needles at 1K-2K "
        "(3 tasks, 3 trials)",
        conversion_tasks_retrieval,
        "results/convert-smollm2-retrieval/results.md",
    ),
    Row(
        "The converted SmolLM2 decoding one token after 32K tokens of context, CPU",
        conversion_decode,
        "results/convert/results.md",
    ),
]
MAX_ROWS, CELL = 8, 120  # the README's limits: rows, and characters in any cell


def headline(files: Files) -> str:
    if len(ROWS) > MAX_ROWS:
        raise ValueError(f"ROWS: {len(ROWS)} headline rows; the README shows at most {MAX_ROWS}")
    lines = ["| claim | number | link |", "|---|---|---|"]
    for row in ROWS:
        if not (files.root / row.source).is_file():
            raise ValueError(f"ROWS: the row {row.claim[:40]!r}... links {row.source}, which does not exist")
        cells = [row.claim, row.figure(files), f"[{row.source}]({row.source})"]
        long = [c for c in cells if len(c) > CELL]
        if long:
            raise ValueError(f"ROWS: {long[0][:40]!r}... has {len(long[0])} characters; a cell holds at most {CELL}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _replace(text: str, markers: tuple[str, str], body: str, where: str) -> str:
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{where}: needs exactly one {start} ... {end}")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"


def _sections(text: str, kind: str) -> list[str]:
    """The sections between markers, without the empty ones: a pair of
    markers with nothing between them holds the place of results a command
    has not written yet (e.g. a long run's later reports)."""
    names = re.findall(rf"<!-- {kind}:([\w.-]+):start -->", text)
    return [n for n in names if f"<!-- {kind}:{n}:start -->\n<!-- {kind}:{n}:end -->" not in text]


def results_folders(root: Path) -> dict[str, str]:
    """Section name -> folder under results/: results/NAME, and a stage of a
    plan written inside its plan's folder, results/PLAN/STAGE, as section
    PLAN-STAGE (experiments/lm_variants/plans.py stage_outputs)."""
    found = {p.parent.name: p.parent.name for p in (root / "results").glob("*/results.md")}
    for p in (root / "results").glob("*/*/results.md"):
        found[f"{p.parent.parent.name}-{p.parent.name}"] = f"{p.parent.parent.name}/{p.parent.name}"
    return dict(sorted(found.items()))


def _results_index(root: Path, names: list[str]) -> str:
    lines = ["| results | written (UTC) | machine, threads | records | plots |", "|---|---|---|---|---|"]
    folders = results_folders(root)
    for name in names:
        rel = folders[name]
        data = json.loads((root / "results" / rel / "results.json").read_text())
        if isinstance(data, dict):  # written by `latte eval --out`: provenance and records in one file
            m, n = data["machine"], len(data["records"])
        else:  # written by an experiment: records here, provenance in run.json
            m, n = json.loads((root / "results" / rel / "run.json").read_text())["machine"], len(data)
        pngs = ", ".join(f"[{p.stem}]({rel}/{p.name})" for p in sorted((root / "results" / rel).glob("*.png")))
        lines.append(
            f"| [{name}]({rel}/results.md) | {m['time_utc'][:16].replace('T', ' ')} | "
            f"{m['cpu_model']}, {m['threads']} | {n} | {pngs or '-'} |"
        )
    return "\n".join(lines)


def _bench_index(root: Path, names: list[str]) -> str:
    lines = [
        "| benchmark | written (UTC) | machine, threads | load (1 min), start -> end | files |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        m = json.loads((root / BENCH_RESULTS / f"{name}.json").read_text())["machine"]
        files = ", ".join(
            f"[{ext}](results/{name}.{ext})"
            for ext in ("md", "json", "png")
            if (root / BENCH_RESULTS / f"{name}.{ext}").is_file()
        )
        load = f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}" if "loadavg_end" in m else "-"
        lines.append(
            f"| {name} | {m['time_utc'][:16].replace('T', ' ')} | {m['cpu_model']}, {m['threads']} | {load} | {files} |"
        )
    return "\n".join(lines)


def _index_readme(root: Path, folder: str, kind: str, found: list[str], write: bool) -> list[str]:
    """Fill one index README (results/ or benchmarks/): its index table and every section, each from
    the file the command wrote. Returns the problems; writes the file when `write`."""
    path = root / folder / "README.md"
    text = path.read_text()
    listed = _sections(text, kind)
    problems = [
        f"{folder}/{n}: no section in {folder}/README.md (add <!-- {kind}:{n}:start --> and "
        f"<!-- {kind}:{n}:end --> under a heading, then run python tools/readme_tables.py)"
        for n in found
        if n not in listed
    ] + [f"{folder}/README.md: section {kind}:{n} has no {folder}/{n} files" for n in listed if n not in found]
    if problems:
        return problems
    new = path.with_name("README.md.new")  # update_readme works on a file: fill a copy
    new.write_text(_replace(text, INDEX, (_results_index if kind == "results" else _bench_index)(root, listed), path))
    try:
        for n in listed:
            if kind == "results":
                out = root / "results" / results_folders(root)[n]
                update_readme(new, n, readme_body((out / "results.md").read_text(), out, new), kind="results")
            else:
                update_readme(
                    new,
                    n,
                    (root / BENCH_RESULTS / f"{n}.md").read_text(),
                    f"results/{n}.png" if n in IMAGE_IN_README else None,
                )
        generated = new.read_text()
    finally:
        new.unlink()
    if generated != text:
        if not write:
            return [f"{folder}/README.md differs from what python tools/readme_tables.py generates"]
        path.write_text(generated)
    return []


def run(root: Path = ROOT, *, write: bool) -> list[str]:
    """Generate every table; return the problems (a file that differs, when not writing)."""
    root = Path(root)
    problems = []
    readme = root / "README.md"
    text = readme.read_text()
    generated = _replace(text, HEADLINE, headline(Files(root)), "README.md")
    if generated != text:
        if write:
            readme.write_text(generated)
        else:
            problems.append("README.md: the headline table differs from what python tools/readme_tables.py generates")
    results = list(results_folders(root))
    benches = sorted(p.stem for p in (root / BENCH_RESULTS).glob("*.md"))
    problems += _index_readme(root, "results", "results", results, write)
    problems += _index_readme(root, "benchmarks", "bench", benches, write)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file differs")
    a = p.parse_args(argv)
    problems = run(ROOT, write=not a.check)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
