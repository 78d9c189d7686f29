"""`latte export` of a conversion (docs/conversion.md §4): a run or step
folder of `latte convert`, or a converted folder, written as a portable
converted folder (the base's files bundled, or every tensor)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from latte.config_io import load_yaml
from latte.models.convert import load_converted
from latte.models.convert.io import CONFIG_NAME, WEIGHTS_NAME, export_portable
from latte.train.convert import HF_TOKENIZER_DIR
from latte.train.lm import TOKENIZER_FILES
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


def export_converted(source: str | Path, out: str | Path, *, self_contained: bool = False, base_path=None) -> Path:
    """`latte export` of a conversion (docs/conversion.md §4): SOURCE is a
    run or step folder of `latte convert`, or a converted folder; OUT gets a
    portable converted folder (the base's files bundled, or every tensor
    with self_contained) and the tokenizer files."""
    src, dst = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    if dst == src or src in dst.parents:
        raise ValueError(f"OUT {out}: inside the source folder {source}; choose a folder outside it")
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
    export_portable(model, dst, self_contained=self_contained)
    for f in tokenizer_files:
        shutil.copy(f, dst / f.name)
    return dst
