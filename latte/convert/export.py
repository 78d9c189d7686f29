"""`latte export` of a conversion (docs/conversion.md §4): a run or step
folder of `latte convert`, or a converted folder, written as a portable
converted folder (the base's files bundled, or every tensor); of a trained
language model (export_language_model). Also the destination check every
`latte export` runs first (docs/reliability.md §8). Both write into a
sibling folder that replaces OUT whole when written, OUT held meanwhile
(latte/guard.py: claim_folder, staged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from latte.config_io import load_yaml
from latte.convert import load_converted
from latte.convert.io import CONFIG_NAME, WEIGHTS_NAME, export_portable
from latte.convert.task import HF_TOKENIZER_DIR
from latte.guard import check_folder, claim_folder
from latte.train.lm import TOKENIZER_FILES
from latte.train.manifest import MANIFEST, step_dirs
from latte.train.rundir import LOCK_NAME
from latte.train.runs import open_run


def is_conversion(source: str | Path) -> bool:
    """A converted folder (config.json of model_type latte_converted), or a
    run / step folder of `latte convert` (its config.yaml says task: convert)."""
    src = Path(source).expanduser()
    if (src / "config.json").is_file():
        try:
            return json.loads((src / "config.json").read_text()).get("model_type") == "latte_converted"
        except (json.JSONDecodeError, AttributeError):
            return False
    if (src / "config.yaml").is_file():
        data = load_yaml(src / "config.yaml")
        return isinstance(data, dict) and data.get("task") == "convert"
    return False


EXPORT_WRITER = "latte export"  # the writer named in an export folder's marker (latte/guard.py)


def check_export_destination(source: str | Path, out: str | Path) -> None:
    """OUT must lie outside the run (or folder) being exported and outside
    any run folder or checkpoint: files written there would replace a run's
    own (its tokenizer), or turn a checkpoint into one that fails its
    manifest, which `latte generate` then silently skips and the next
    `latte train` moves aside (docs/reliability.md §8)."""
    src, dest = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    run = src.parent if (src / MANIFEST).is_file() else src
    for folder in (dest, *dest.parents):
        if folder in (src, run):
            what = f"the folder being exported ({folder})"
        elif (folder / MANIFEST).is_file():
            what = f"a checkpoint ({folder})"
        elif (folder / LOCK_NAME).is_file() or step_dirs(folder):
            what = f"a run folder ({folder})"
        else:
            continue
        raise ValueError(
            f"OUT {out}: inside {what}; the export would replace or add files there. "
            "Choose a folder outside any run folder, e.g. exports/NAME"
        )
    check_folder(out, EXPORT_WRITER, flag="OUT")  # new, empty or an earlier export; never a base model's folder


def export_converted(source: str | Path, out: str | Path, *, self_contained: bool = False, base_path=None) -> Path:
    """`latte export` of a conversion (docs/conversion.md §4): SOURCE is a
    run or step folder of `latte convert`, or a converted folder; OUT gets a
    portable converted folder (the base's files bundled, or every tensor
    with self_contained) and the tokenizer files."""
    src, dst = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    check_export_destination(source, out)
    if (src / CONFIG_NAME).is_file():
        model = load_converted(src, base_path=base_path)
        skip = {CONFIG_NAME, WEIGHTS_NAME, "generation_config.json"}
        tokenizer_files = [f for f in sorted(src.iterdir()) if f.is_file() and f.name not in skip]
    else:
        if base_path is not None:
            raise ValueError("--base-path: only for a converted folder; a run finds its base through base.path")
        trained = open_run(src)
        model = trained.model.model
        hf = Path(trained.checkpoint).parent / HF_TOKENIZER_DIR
        own = [trained.checkpoint / n for n in TOKENIZER_FILES if (trained.checkpoint / n).is_file()]
        tokenizer_files = sorted(hf.iterdir()) if hf.is_dir() else own
    with claim_folder(out, EXPORT_WRITER, flag="OUT", staged=True) as stage:  # swapped in whole when written
        export_portable(model, stage, self_contained=self_contained)
        for f in tokenizer_files:
            shutil.copy(f, stage / f.name)
    return dst


def export_language_model(model, tokenizer, out: str | Path) -> Path:
    """`latte export` of a trained language model (a LatteForCausalLM and its
    latte.data tokenizer): OUT gets what transformers loads, written into a
    sibling folder and swapped in whole, OUT held meanwhile (latte/guard.py).
    An earlier export's files there are replaced, its bundled base/ included."""
    from latte.models.pretrained import export_for_transformers  # needs the optional transformers

    with claim_folder(out, EXPORT_WRITER, flag="OUT", staged=True) as stage:
        export_for_transformers(model, tokenizer, stage)
    return Path(out).expanduser().resolve()
