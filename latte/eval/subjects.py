"""What `latte eval` evaluates (docs/evaluation.md §8): the model a path
names, opened whatever its kind (`open_model`), and for a converted model
the models it is compared with, all made from it (docs/evaluation.md §7):

  original      the pretrained model (`as_original()`: full attention)
  window        the window alone (`as_sliding_window(num_sinks=0)`: beta at
                -30, LoRA off), i.e. the converted model before up-training
  window+sinks  the window plus the first k tokens (`as_sliding_window(
                num_sinks=k)`: training-free, StreamingLLM's baseline, at
                the converted model's sink positions); `latte eval
                --against window` names this one
  converted     the up-trained model as it is

and, on request, ablations of the sinks: converted-nosinks, the up-trained
model with its sinks off (`with_sinks(0)`; latents, beta and LoRA kept);
window+cachesinks and converted-cachesinks, the window + sinks and the
converted model with the sinks scored at StreamingLLM's cache positions
(`with_sinks(positions="cache")`, docs/math.md §4.1).
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from latte.config_io import load_yaml, merge, parse_overrides
from latte.data import load_tokenizer
from latte.data.tokenizer import Tokenizer
from latte.models import LatteConfig, from_pretrained
from latte.models.pretrained import ARCHITECTURES, CONFIG_NAME, load_config, transformers_tokenizer
from latte.models.weights import WEIGHTS_NAME, load_weights
from latte.train.manifest import MANIFEST
from latte.train.runs import open_run

MODELS = (
    "original",
    "window",
    "window+sinks",
    "converted",
    "converted-nosinks",
    "window+cachesinks",
    "converted-cachesinks",
)
DEFAULT_MODELS = MODELS[:4]  # the others on request (--models): ablations of the sinks
# the up-trained weights: their cells name them (Subject.identity)
TRAINED = ("converted", "converted-nosinks", "converted-cachesinks")


def sinks_cell(model: str, sinks: int) -> dict:
    """The k a training-free window + sinks model's cells record ({} for the others)."""
    return {"sinks": sinks} if model.startswith("window+") else {}


def bos_cell(subject: Subject) -> dict:
    """{"bos": 1} in the cells of a model whose texts start with its
    beginning-of-sequence token ({} otherwise: cells from before it existed
    stay valid for models without one)."""
    return {"bos": 1} if subject.bos else {}


DEFAULT_SINKS = 4  # window+sinks when the converted model has none of its own


@dataclass
class Subject:
    """The model under evaluation and what reads text for it: a converted
    model (kind "converted"), a native LatteForCausalLM ("native") or any
    other Hugging Face causal LM ("hf")."""

    model: object  # ConvertedForCausalLM, LatteForCausalLM or a transformers causal LM
    tokenizer: object  # latte.data.Tokenizer
    source: Path  # the run or model folder it came from
    run: object | None = None  # latte.train.runs.TrainedRun when opened from a run folder
    hf_tokenizer_dir: Path | None = None  # transformers tokenizer files, if any
    hf: object | None = None  # a transformers tokenizer already loaded (wins over hf_tokenizer_dir)
    kind: str = "converted"
    sets: tuple[str, ...] = ()  # the config overrides it was opened with (latte eval --set)

    @property
    def identity(self) -> str:
        """What names the converted model's weights in sweep cells: the
        model folder, or the run folder and the checkpoint opened (a run
        still training gains newer ones; their cells are not reused)."""
        if (
            self.run is None or Path(self.run.checkpoint).resolve() == Path(self.source).resolve()
        ):  # a model or step folder
            return str(self.source)
        return f"{self.source}/{Path(self.run.checkpoint).name}"

    @functools.cached_property
    def bos(self) -> list[int]:
        """[the beginning-of-sequence id] when the base model's tokenizer puts
        one before every text (Gemma's does, SmolLM2's does not), else []:
        held-out documents and needle prompts then start with it, as the
        model was trained and as lm-eval feeds the tasks. Gemma without it
        reads text at about twice the perplexity (docs/conversion.md §6)."""
        tok = self.hf_tokenizer
        first = tok("a")["input_ids"][:1]
        return first if tok.bos_token_id is not None and first == [tok.bos_token_id] else []

    @functools.cached_property
    def hf_tokenizer(self):
        """The tokenizer lm-eval reads with: the base model's own transformers
        files when the run wrote them, else one built from the latte tokenizer
        (loaded once: `bos` and the tasks stage share it)."""
        if self.hf is not None:
            return self.hf
        if self.hf_tokenizer_dir is not None:
            from transformers import AutoTokenizer  # optional dependency (extra "hf")

            return AutoTokenizer.from_pretrained(str(self.hf_tokenizer_dir))
        return transformers_tokenizer(self.tokenizer)


def open_subject(path: str | Path, flag: str = "--converted", sets: tuple[str, ...] = ()) -> Subject:
    """A `latte convert` run folder (its newest checkpoint), one of its
    step-N checkpoint folders (a point of the learning curve) or a converted
    model folder (config.json of model_type latte_converted + tokenizer;
    `sets`: overrides of its conversion fields, as `model.FIELD=VALUE`)."""
    p = Path(path)
    config = p / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "latte_converted":
        from latte.convert import load_converted  # optional dependency: transformers (extra "hf")

        if not (p / "tokenizer.json").is_file():
            raise ValueError(f"{flag} {p}: a converted model folder needs its tokenizer.json beside config.json")
        hf = p if (p / "tokenizer_config.json").is_file() else None
        model = load_converted(p, overrides=_export_overrides(p, sets))
        return Subject(model, load_tokenizer(p / "tokenizer.json"), p, None, hf, sets=sets)
    if not p.exists():
        raise ValueError(
            f"{flag} {p}: no such folder (expected a latte convert run, one of its step-N folders or its model/ folder)"
        )
    from latte.convert.task import HF_TOKENIZER_DIR  # optional dependency: transformers (extra "hf")

    trained = open_run(p)
    if trained.config.task != "convert":
        raise ValueError(f"{flag} {p}: a run of task {trained.config.task!r}, expected 'convert'")
    hf = (p.parent if (p / MANIFEST).is_file() else p) / HF_TOKENIZER_DIR  # the run folder's, beside its steps
    return Subject(trained.model.model, trained.tokenizer, p, trained, hf if hf.is_dir() else None)


# --------------------------------------------------------------------------- any model (latte eval MODEL)

KINDS = (
    "a latte train or latte convert run folder or one of its step-N folders, a folder written by latte export "
    "(native or converted), a Hugging Face model folder, a .gguf file, or a base alias ({aliases})"
)


def _aliases() -> tuple[str, ...]:
    from latte.convert.io import NAMED_BASES  # optional dependency: transformers (extra "convert")

    return tuple(NAMED_BASES)


def open_model(path: str | Path, sets: tuple[str, ...] = ()) -> Subject:
    """The model `latte eval MODEL` names, whatever its kind (KINDS), with
    the config overrides `sets` ("section.field=value"): a run's config
    rebuilds its model (`model.` names a conversion's `conversion`
    section); an exported folder's model config takes `model.` ones. A
    path that is none of these is a ValueError naming them."""
    p = Path(path).expanduser()
    is_run = (p / MANIFEST).is_file() or any(p.glob(f"step-*/{MANIFEST}")) if p.is_dir() else False
    if is_run:
        return _open_run_model(p, sets)
    config = p / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if sets and model_type not in ("latte", "latte_converted"):
        raise ValueError(
            f"--set {' '.join(sets)}: only a run or step folder's config, or a folder written by latte export, "
            f"can be overridden (its model is rebuilt from it); {p} is neither"
        )
    if model_type == "latte_converted":
        return open_subject(p, flag="MODEL", sets=sets)
    if model_type == "latte":
        return _open_native_export(p, sets)
    if config.is_file():
        return _open_hf(p, None, p)
    if p.is_file() and p.suffix == ".gguf":
        return _open_hf(p.parent, p.name, p)
    if not p.exists() and str(path) in _aliases():
        from latte.convert.io import resolve_base  # optional dependency: transformers (extra "convert")

        folder, gguf = resolve_base(str(path), where="MODEL")
        return _open_hf(folder, gguf, folder / gguf if gguf else folder)  # its files: what the sha256 names
    raise ValueError(
        f"MODEL {path}: not a model latte eval can open; expected {KINDS.format(aliases=', '.join(_aliases()))}"
    )


def _export_overrides(p: Path, sets: tuple[str, ...]) -> dict:
    """--set overrides of an exported folder, {field: value}: its model's
    config is all it holds, so only `model.FIELD=VALUE` (for a converted
    model, a field of its conversion section)."""
    data = parse_overrides(list(sets)) if sets else {}
    other = sorted(set(data) - {"model"})
    if other:
        raise ValueError(
            f"--set {' '.join(sets)}: {p} is an exported model, whose config is its model's alone; expected "
            f"model.FIELD=VALUE overrides, got {', '.join(repr(o) for o in other)}"
        )
    return data.get("model", {})


def _open_native_export(p: Path, sets: tuple[str, ...]) -> Subject:
    """A native model folder written by latte export, with `model.` overrides
    of its config.json applied before the model is built."""
    overrides = _export_overrides(p, sets)
    if not overrides:
        return Subject(from_pretrained(p).eval(), load_tokenizer(p), p, kind="native")
    config, arch = load_config(p)
    where = f"{p / CONFIG_NAME} + --set {' '.join(sets)}"
    config = LatteConfig.from_dict(merge(config.to_dict(), overrides), where=where)
    model = ARCHITECTURES[arch or "LatteForCausalLM"](config)
    load_weights(model, p / WEIGHTS_NAME)
    return Subject(model.eval(), load_tokenizer(p), p, kind="native", sets=sets)


def _open_run_model(p: Path, sets: tuple[str, ...]) -> Subject:
    trained = open_run(p, sets=_section_names(p, sets))
    task = trained.config.task
    if task == "convert":
        from latte.convert.task import HF_TOKENIZER_DIR  # optional dependency: transformers (extra "convert")

        hf = (p.parent if (p / MANIFEST).is_file() else p) / HF_TOKENIZER_DIR
        model = trained.model.model  # Distiller -> the converted model
        return Subject(model, trained.tokenizer, p, trained, hf if hf.is_dir() else None, sets=sets)
    if task != "lm":
        raise ValueError(f"MODEL {p}: a run of task {task!r}; latte eval evaluates language models (tasks lm, convert)")
    return Subject(trained.model, trained.tokenizer, p, trained, kind="native", sets=sets)


def _section_names(p: Path, sets: tuple[str, ...]) -> list[str]:
    """--set overrides as open_run takes them: `model.` is the conversion
    section of a convert run (its model's config), the model section of others."""
    run = p.parent if (p / MANIFEST).is_file() else p
    task = load_yaml(run / "config.yaml").get("task", "lm") if (run / "config.yaml").is_file() else "lm"
    out = []
    for s in sets:
        if task == "convert" and s.startswith("model."):
            s = "conversion." + s.removeprefix("model.")
        out.append(s)
    return out


def _open_hf(folder: Path, gguf: str | None, source: Path) -> Subject:
    """A transformers causal LM (a folder, a GGUF file) and its tokenizer."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ImportError(
            "latte eval of a Hugging Face model needs transformers: pip install 'latte[convert]'"
        ) from None
    kw = {"gguf_file": gguf} if gguf else {}
    try:
        hf = AutoTokenizer.from_pretrained(str(folder), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kw).eval()
    except (OSError, KeyError) as e:
        raise ValueError(f"MODEL {source}: transformers cannot load it ({e})") from None
    eos = hf.eos_token_id if hf.eos_token_id is not None else 0
    tokenizer = Tokenizer(hf.backend_tokenizer, eos_id=eos)
    return Subject(model, tokenizer, source, hf=hf, kind="hf")


def original_context(subject: Subject | None) -> int | None:
    """The base model's own context (its config's max_position_embeddings:
    8,192 for SmolLM2-135M, 32,768 for Gemma 3 270M), or None if unknown."""
    config = getattr(getattr(getattr(subject, "model", None), "base", None), "config", None)
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) else None


def sinks_of(subject: Subject, requested: int | None) -> int:
    """k of the window+sinks model: as asked, else the converted model's own
    num_sinks, else DEFAULT_SINKS."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--sinks {requested}: expected an integer >= 1")
        return requested
    own = getattr(subject.model.conversion, "num_sinks", 0)
    return own or DEFAULT_SINKS


@contextlib.contextmanager
def as_model(subject: Subject, name: str, sinks: int):
    """The model `name` (MODELS) as a causal LM: the pretrained one inside
    as_original(), the others a ConvertedForCausalLM in the right mode."""
    model = subject.model
    if name == "original":
        with model.as_original() as base:
            yield base
    elif name == "window":
        with model.as_sliding_window(num_sinks=0) as m:
            yield m
    elif name == "window+sinks":
        with model.as_sliding_window(num_sinks=sinks) as m:
            yield m
    elif name == "converted":
        yield model
    elif name == "converted-nosinks":
        with model.with_sinks(0) as m:
            yield m
    elif name == "window+cachesinks":
        with model.as_sliding_window(num_sinks=sinks) as m, m.with_sinks(positions="cache"):
            yield m
    elif name == "converted-cachesinks":
        with model.with_sinks(positions="cache") as m:
            yield m
    else:
        raise ValueError(f"model {name!r}: expected one of {MODELS}")


def label(model: str, sinks: int | None) -> str:
    """How reports name a model of MODELS (k the window+sinks model's sinks)."""
    names = {
        "window+sinks": f"window + {sinks} sinks",
        "window+cachesinks": f"window + {sinks} sinks at cache positions",
        "converted-nosinks": "converted, sinks off",
        "converted-cachesinks": "converted, sinks at cache positions",
    }
    return names.get(model, model)


def check_models(text: str) -> list[str]:
    names = [m for m in text.split(",") if m]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise ValueError(f"--models {text!r}: expected a comma-separated subset of {','.join(MODELS)}")
    return [m for m in MODELS if m in names]
