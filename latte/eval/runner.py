"""`latte eval MODEL`: the evaluations of any model, resumable cell by cell,
into one results folder (docs/evaluation.md §8).

    request    what was asked: the suites, the models compared, lengths,
               data, override sets (`--set`), the output folder
    subjects   the model as opened (latte/eval/subjects.py: open_model), one
               more per override set, and for a converted model `original`
               and `window` (window + sinks at its sink positions)
    suites     ppl, tasks, fewshot, needle, retrieval, latents, mass, slots (suites.py);
               each one's cells are a Sweep under OUT/cells-SUITE
               (latte/eval/cells.py: the one reuse rule), its records and
               table beside its metric
    report     OUT/results.json (provenance + flat records, one "suite"
               field each) and OUT/results.md (provenance + one table per
               suite)

Everything a user can get wrong (a suite, a length, --against for a native
model, a model a suite cannot take, a missing optional package) is a
ValueError or ImportError naming it: `latte eval` exits 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from latte.config_io import parse_overrides
from latte.eval import suites
from latte.eval.cells import Sweep, digest_or_missing
from latte.eval.retrieval import HAYSTACKS
from latte.eval.subjects import Subject, as_model, label, open_model, sinks_of
from latte.files import atomic_write
from latte.guard import check_folder, claim_folder
from latte.reporting import machine_info

SUITES = ("ppl", "tasks", "fewshot", "needle", "retrieval", "latents", "mass", "slots")
AGAINST = ("original", "window")
EVAL_WRITER = "latte eval"  # the writer an --out folder's marker names (latte/guard.py)


@dataclass
class Request:
    """One `latte eval` command (the CLI's arguments, parsed)."""

    model: str
    suites: tuple[str, ...] = ("ppl",)
    against: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()  # in tokens
    multiples: tuple[int, ...] = ()  # of a run's training length
    data: str | None = None
    sets: tuple[str, ...] = ()  # one override set per entry: "a.b=1,c.d=2"
    out: str | None = None
    documents: int = 2
    max_tokens: int = 65536
    batch_size: int = 8
    trials: int = 1
    tasks: tuple[str, ...] = ()  # of the tasks, fewshot and retrieval suites (default: theirs)
    examples: int = 20  # per task: tasks, fewshot
    haystack: str = "essays"  # retrieval, mass, slots: retrieval.HAYSTACKS
    deadline: float | None = None  # time.time(): no cell starts after it (parse_deadline)
    command: str = field(default_factory=lambda: shlex.join(["latte", *sys.argv[1:]]))

    def __post_init__(self):
        bad = [s for s in self.suites if s not in SUITES]
        if bad or not self.suites:
            raise ValueError(
                f"--suite {','.join(self.suites)!r}: expected a comma-separated subset of {','.join(SUITES)}"
            )
        bad = [a for a in self.against if a not in AGAINST]
        if bad:
            raise ValueError(
                f"--against {','.join(self.against)!r}: expected a comma-separated subset of {','.join(AGAINST)}"
            )
        if self.haystack not in HAYSTACKS:
            raise ValueError(f"--haystack {self.haystack!r}: expected one of {', '.join(HAYSTACKS)}")
        if self.haystack != "essays" and not set(self.suites) & set(suites.HAYSTACK_SUITES):
            *head, last = suites.HAYSTACK_SUITES
            readers = f"{', '.join(head)} and {last}"
            raise ValueError(f"--haystack {self.haystack}: only the {readers} suites read a haystack")
        for flag, values in (("--lengths", self.lengths), ("--multiples", self.multiples)):
            if any(v < 1 for v in values):
                raise ValueError(f"{flag} {','.join(map(str, values))}: expected integers >= 1")
        if self.lengths and self.multiples:
            raise ValueError(
                "--lengths and --multiples: give one of them (tokens, or multiples of the training length)"
            )


def parse_lengths(text: str, flag: str = "--lengths") -> tuple[int, ...]:
    """ "1k,2k,4096" -> (1024, 2048, 4096), sorted and distinct."""
    out = set()
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)(k?)", part)
        if m is None:
            raise ValueError(f"{flag} {text!r}: expected comma-separated integers like 1k,2k,4096 (k = 1024)")
        out.add(int(m.group(1)) * (1024 if m.group(2) else 1))
    if not out:
        raise ValueError(f"{flag} {text!r}: no lengths given")
    return tuple(sorted(out))


def parse_deadline(text: str) -> float:
    """--deadline: a UTC time like 2026-11-22T18:45 as a time.time() value."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--deadline {text!r}: expected a UTC time like 2026-11-22T18:45") from None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def split_name(text: str) -> tuple[str, str]:
    """One --set value -> (its NAME, the overrides): "NAME:a.b=1,c.d=2"
    names the model it makes in the tables; without "NAME:" the name is ""."""
    m = re.match(r"\s*([A-Za-z][\w+-]*):(?=\s*-*[A-Za-z_]\w*(?:\.\w+)+=)", text)
    return (m.group(1), text[m.end() :]) if m else ("", text)


def split_set(text: str) -> tuple[str, ...]:
    """One --set value: overrides "section.field=value" separated by commas
    before the next "section.field=" (a value may hold commas: [1,2]); a
    leading "NAME:" is the model's name (split_name), not an override."""
    text = split_name(text)[1]
    parts = tuple(p.strip() for p in re.split(r",(?=\s*-*[A-Za-z_]\w*(?:\.\w+)+=)", text) if p.strip())
    bad = [p for p in parts if not re.fullmatch(r"-*[A-Za-z_]\w*(\.\w+)+=.*", p, flags=re.S)]
    if bad or not parts:
        raise ValueError(f"--set {text!r}: expected section.field=value (several: a.b=1,c.d=2)")
    return tuple(p.lstrip("-") for p in parts)


# --------------------------------------------------------------------------- subjects


@dataclass
class Evaluated:
    """One model of every table: `name` as the tables show it, the opened
    subject, the mode as_model puts a converted model in, its override set
    and the name --set gave it (`title`: shown in place of the overrides;
    the cells name the overrides, so renaming a set reuses its cells)."""

    name: str
    subject: Subject
    mode: str
    set: str = ""
    sinks: int = 0
    title: str = ""
    memory: tuple | None = None  # (slots, rule, positions) set on the opened model itself (memory_only)

    @property
    def label(self) -> str:
        text = label(self.mode, self.sinks) if self.subject.kind == "converted" else self.name
        return f"{text} [{self.title or self.set}]" if self.set else text

    def fields(self) -> dict:
        """The fields naming this model in records: the model, its override
        set and the set's name, if any."""
        return {
            "model": self.name,
            **({"set": self.set} if self.set else {}),
            **({"subject": self.title} if self.title else {}),
        }

    def cell(self) -> dict:
        """The fields naming this model in a cell: the model, the override
        set, the sinks of a window model, the weights of a trained one."""
        cell = {"model": self.name}
        if self.set:
            cell["set"] = self.set
        if self.mode.startswith("window+"):
            cell["sinks"] = self.sinks
        if self.mode != "original" and not self.mode.startswith("window"):
            cell["source"] = self.subject.identity
        return cell

    @contextlib.contextmanager
    def use(self):
        """The model as a causal LM, in this subject's mode."""
        if self.subject.kind != "converted":
            yield self.subject.model
        elif self.memory is not None:
            with memory_settings(self.subject.model, *self.memory) as model:
                yield model
        else:
            with as_model(self.subject, self.mode, self.sinks) as model:
                yield model


def kernel_choice(req: Request) -> tuple[tuple[str, ...], Request]:
    """(the --set values that only choose the kernels, `model.backend=` or a
    conversion's `conversion.backend=`, and `req` without them). Such a set
    makes no model of its own: every model is opened with it, so a model
    saved with a backend this machine cannot run ("fla" without CUDA) is
    evaluated on the kernels it names (latte.ops.backend.saved_backend)."""
    kernels, rest = [], []
    for text in req.sets:
        name, sets = split_name(text)[0], split_set(text)
        if not name and all(s.partition("=")[0] in ("model.backend", "conversion.backend") for s in sets):
            kernels += sets
        else:
            rest.append(text)
    return tuple(kernels), dataclasses.replace(req, sets=tuple(rest))


def subjects(base: Subject, req: Request) -> list[Evaluated]:
    """The model, one more per override set, then `--against`'s models
    (each opened with the base's own overrides: kernel_choice)."""
    if req.against and base.kind != "converted":
        raise ValueError(
            f"--against {','.join(req.against)}: only for converted models (a latte convert run or its export); "
            f"{req.model} is a {base.kind} model"
        )
    main = "converted" if base.kind == "converted" else "model"
    out = [Evaluated(main, base, main)]
    names = [split_name(text)[0] for text in req.sets]
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise ValueError(
            f"--set {twice[0]}:...: the name {twice[0]!r} is given to {names.count(twice[0])} sets; "
            "each NAME names one model"
        )
    for text, title in zip(req.sets, names):
        sets = split_set(text)
        memory = memory_only(base, sets)
        opened = base if memory is not None else open_model(req.model, (*base.sets, *sets))
        out.append(Evaluated(main, opened, main, set=",".join(sets), title=title, memory=memory))
    sinks = sinks_of(base, None) if base.kind == "converted" else 0
    for name in req.against:
        out.append(Evaluated(name, base, "original" if name == "original" else "window+sinks", sinks=sinks))
    return out


MEMORY_FIELDS = ("memory_slots", "memory_rule", "memory_positions")


def memory_only(base: Subject, sets: tuple[str, ...]) -> tuple | None:
    """(slots, rule, positions) when every override of a converted model's
    set is a memory field of its conversion (docs/math.md §4.2): the model
    already open takes them layer by layer (memory_settings), as a rebuild
    from its config would, without loading the base model again; else None.
    Checked as the config checks them (a bad value is a ValueError)."""
    if base.kind != "converted":
        return None
    data = parse_overrides([f"{s.partition('=')[0]}={s.partition('=')[2]}" for s in sets])
    fields = {k: v for section in data.values() if isinstance(section, dict) for k, v in section.items()}
    if not set(data) <= {"model", "conversion"} or not set(fields) <= set(MEMORY_FIELDS):
        return None
    conversion = dataclasses.replace(base.model.conversion, **fields)  # its checks: exit 2 on a bad value
    return tuple(getattr(conversion, f) for f in MEMORY_FIELDS)


@contextlib.contextmanager
def memory_settings(model, slots: int, rule: str, positions: str):
    """Inside the block, every converted layer of `model` keeps `slots`
    memory slots chosen by `rule` at `positions` (what ConversionConfig's
    memory fields give a rebuilt model: latte/convert/modeling.py); each
    layer's own settings are restored after, also on an error."""
    layers = list(model.converted)
    saved = [(a.memory, a.memory_positions) for a in layers]
    try:
        for a in layers:
            a.use_memory(slots, rule, layer_index=a.layer_idx)
            a.memory_positions = positions
        yield model
    finally:
        for a, (memory, where) in zip(layers, saved):
            a.memory, a.memory_positions = memory, where


# --------------------------------------------------------------------------- sweeps and folders


@dataclass
class Context:
    """What every suite reads: the request, the opened model, the output
    folder and the protocol its cells record."""

    req: Request
    base: Subject
    out: Path
    sweeps: dict = field(default_factory=dict)  # suite -> its Sweep

    def sweep(self, suite: str, cells: list[dict], options: dict, fields=()) -> Sweep:
        """The suite's cells under OUT/cells-SUITE, each recording the suite's
        options and the sha256 of the model's files (latte/eval/cells.py);
        past --deadline no cell starts."""
        inputs = {"model": digest_or_missing(self.base.source)}
        protocol = {"suite": suite, **options, "inputs": inputs}
        late = None if self.req.deadline is None else (lambda: time.time() >= self.req.deadline)
        sweep = Sweep(
            self.out / f"cells-{suite}", cells, protocol=protocol, fields=fields, folder_flag="--out", stop=late
        )
        self.sweeps[suite] = sweep
        return sweep

    def missing(self, suite: str, evaluated: list[Evaluated]) -> dict[str, int]:
        """The suite's cells not finished (--deadline): their count per model
        label, task and context, as "label, task, context" -> count."""
        sweep, out = self.sweeps.get(suite), {}
        for cell in [] if sweep is None else sweep.cells:
            if not sweep.done(cell):
                what = [suites.model_of(evaluated, cell).label, cell.get("task"), cell.get("context")]
                key = ", ".join(f"{x:,}" if isinstance(x, int) else str(x) for x in what if x is not None)
                out[key] = out.get(key, 0) + 1
        return out


def default_out(model: str, base: Subject) -> Path:
    """MODEL/eval for a folder; RUN/eval/step-N for a step folder (a
    checkpoint holds only its manifest's files); FILE.eval for a file."""
    p = Path(model).expanduser()
    if p.is_file():
        return p.with_name(p.name + ".eval")
    if not p.exists():
        raise ValueError(f"MODEL {model}: a base alias has no folder of its own; give --out DIR")
    if (p / "manifest.json").is_file():
        return p.parent / "eval" / p.name
    return p / "eval"


@contextlib.contextmanager
def output_folder(req: Request, base: Subject):
    """The results folder, held for the whole command: the default one
    (the model's own evaluation folder) as it is; an --out folder under the
    write rule (latte/guard.py: new, empty or written by `latte eval`)."""
    if req.out is None:
        out = default_out(req.model, base)
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with claim_folder(req.out, EVAL_WRITER, flag="--out") as out:
        yield Path(out)


def check_out(req: Request) -> None:
    """Before any model is opened: an --out folder the write rule refuses
    fails now (exit 2), not after the evaluation."""
    if req.out is not None:
        check_folder(req.out, EVAL_WRITER, flag="--out")


# --------------------------------------------------------------------------- the command


# optional packages an evaluation may need -> the line that installs them
PIP = {
    "transformers": "pip install 'latte[convert]'",
    "gguf": "pip install 'latte[convert]'",
    "accelerate": "pip install 'latte[convert]'",
    "lm_eval": "pip install 'latte[harness]'",
    "tokenizers": "pip install 'latte[train]'",
    "datasets": "pip install 'latte[datasets]'",
}


def evaluate(req: Request) -> Path:
    """Run every suite of `req` and write OUT/results.json and results.md;
    a missing optional package is an ImportError naming its pip line."""
    try:
        return _evaluate(req)
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in PIP:
            raise
        raise ImportError(f"{req.model}: this evaluation needs the package {top!r}: {PIP[top]}") from None


def _evaluate(req: Request) -> Path:
    check_out(req)
    t0, load0 = time.time(), _load()
    kernels, req = kernel_choice(req)
    base = open_model(req.model, kernels)
    evaluated = subjects(base, req)
    for suite in req.suites:  # a model a suite cannot take: refused before any compute
        suites.SUITES[suite].check(base, req)
    with output_folder(req, base) as out:
        ctx = Context(req, base, out)
        records, tables = [], []
        missing = {}
        for suite in req.suites:
            recs, table = suites.SUITES[suite].run(ctx, evaluated)
            records += [{"suite": suite, **r} for r in recs]
            missing[suite] = ctx.missing(suite, evaluated)
            table = table.strip() + _missing_note(missing[suite], len(ctx.sweeps[suite].cells))
            tables.append(f"## {suite}\n\n{table}\n")
            print(f"\n{table}\n")
        write_report(ctx, evaluated, records, tables, t0, load0, {k: v for k, v in missing.items() if v})
    print(f"latte eval: wrote {out / 'results.json'} and results.md", file=sys.stderr)
    return out


def _missing_note(missing: dict[str, int], total: int) -> str:
    """The line under a suite's table naming the cells --deadline left out."""
    if not missing:
        return ""
    parts = "; ".join(f"{k}: {n}" for k, n in missing.items())
    return f"\n\nNot run (--deadline): {sum(missing.values())} of {total} cells, not in the table above ({parts})."


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def write_report(ctx: Context, evaluated: list[Evaluated], records, tables, t0: float, load0, missing=None) -> None:
    """results.json and results.md: the fields every results folder records
    (command, machine, threads, load, wall time, inputs' sha256), then the
    records (json) or tables (markdown)."""
    machine = machine_info()
    run = {
        "command": ctx.req.command,
        "machine": machine,
        "threads": machine["threads"],
        "load": {"start": load0, "end": _load()},
        "wall_s": round(time.time() - t0, 1),
        "inputs": {"model": digest_or_missing(ctx.base.source)},
        "model": str(ctx.req.model),
        "kind": ctx.base.kind,
        "subjects": [e.label for e in evaluated],
        "sets": {e.title: e.set for e in evaluated if e.title},
        "suites": list(ctx.req.suites),
        "haystack": ctx.req.haystack,  # retrieval, mass, slots
        "missing": missing or {},  # suite -> {"label, task, context": cells not run (--deadline)}
    }
    atomic_write(ctx.out / "results.json", json.dumps({**run, "records": records}, indent=1) + "\n")
    load = f"{load0:.1f}" if load0 is not None else "unknown"
    head = (
        f"# latte eval: {ctx.req.model}\n\nCommand: `{run['command']}`\n\n"
        f"{machine['cpu_model']}, {machine['usable_cores']} cores, torch {machine['torch']}, "
        f"{run['threads']} threads; wall time {run['wall_s']:,.0f} s; 1-min load average {load} at the start\n\n"
        f"Inputs: model ({ctx.base.kind}) sha256 {run['inputs']['model']}; models compared: "
        f"{', '.join(run['subjects'])}\n"
        + "".join(f"\n- `{name}`: `--set {sets}`" for name, sets in run["sets"].items())
        + ("\n" if run["sets"] else "")
    )
    atomic_write(ctx.out / "results.md", head + "\n" + "\n".join(tables))
