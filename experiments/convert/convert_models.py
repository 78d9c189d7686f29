"""The four models every evaluation stage of `latte experiment convert`
compares, all from one converted model (docs/evaluation.md §7):

  original      the pretrained model (`as_original()`: full attention)
  window        the window alone (`as_sliding_window(num_sinks=0)`: beta at
                -30, LoRA off), i.e. the converted model before up-training
  window+sinks  the window plus the first k tokens (`as_sliding_window(
                num_sinks=k)`: training-free, StreamingLLM's baseline)
  converted     the up-trained model as it is

and, on request (--models), ablations of the sinks: converted-nosinks, the
up-trained model with its sinks off (`with_sinks(0)`; latents, beta and
LoRA kept); window+cachesinks and converted-cachesinks, the window + sinks
and the converted model with the sinks scored at StreamingLLM's cache
positions (`with_sinks(positions="cache")`, docs/math.md §4.1).
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from latte.data import load_tokenizer
from latte.models.pretrained import transformers_tokenizer
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
    """The converted model under evaluation and what reads text for it."""

    model: object  # ConvertedForCausalLM
    tokenizer: object  # latte.data.Tokenizer
    source: Path  # the run or model folder it came from
    run: object | None = None  # latte.train.runs.TrainedRun when opened from a run folder
    hf_tokenizer_dir: Path | None = None  # transformers tokenizer files, if any
    hf: object | None = None  # a transformers tokenizer already loaded (wins over hf_tokenizer_dir)

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


def open_subject(path: str | Path) -> Subject:
    """A `latte convert` run folder (its newest checkpoint), one of its
    step-N checkpoint folders (a point of the learning curve) or a converted
    model folder (config.json of model_type latte_converted + tokenizer)."""
    p = Path(path)
    config = p / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "latte_converted":
        from latte.convert import load_converted  # optional dependency: transformers (extra "hf")

        if not (p / "tokenizer.json").is_file():
            raise ValueError(f"--converted {p}: a converted model folder needs its tokenizer.json beside config.json")
        hf = p if (p / "tokenizer_config.json").is_file() else None
        return Subject(load_converted(p), load_tokenizer(p / "tokenizer.json"), p, None, hf)
    if not p.exists():
        raise ValueError(
            f"--converted {p}: no such folder "
            "(expected a latte convert run, one of its step-N folders or its model/ folder)"
        )
    from latte.convert.task import HF_TOKENIZER_DIR  # optional dependency: transformers (extra "hf")

    trained = open_run(p)
    if trained.config.task != "convert":
        raise ValueError(f"--converted {p}: a run of task {trained.config.task!r}, expected 'convert'")
    hf = (p.parent if (p / MANIFEST).is_file() else p) / HF_TOKENIZER_DIR  # the run folder's, beside its steps
    return Subject(trained.model.model, trained.tokenizer, p, trained, hf if hf.is_dir() else None)


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
