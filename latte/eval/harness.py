"""lm-evaluation-harness on latte models, with no glue to write.

    latte harness --model hf --model_args pretrained=EXPORTED_DIR --tasks hellaswag
    latte harness run --model latte --model_args pretrained=DIR --tasks ... --include_path my_tasks/

`latte harness ARGS` registers the latte classes with transformers' Auto
classes (`latte.models.hf.register`) and with lm-eval (model name "latte": its
HF model with those classes registered), then runs lm-eval's own command line
with ARGS unchanged: every lm-eval option works as documented. From Python,
call `register()` before `lm_eval.simple_evaluate(model="latte" or "hf", ...)`.
DIR is a folder written by `latte export` (model and tokenizer) or by
save_pretrained (then pass tokenizer=... in model_args).

Needs the `harness` extra (lm-eval; it brings transformers).
"""

from __future__ import annotations

import sys

MODEL_NAME = "latte"


def _import_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise ImportError("latte harness needs lm-evaluation-harness: pip install 'latte[harness]'") from e


def register() -> None:
    """Makes latte folders loadable by lm-eval's "hf" model and adds the
    model name "latte" (safe to call more than once)."""
    _import_lm_eval()
    from lm_eval.api.registry import model_registry, register_model
    from lm_eval.models.huggingface import HFLM

    from latte.models import hf  # optional dependency: hf imports transformers (extra "hf")

    hf.register()
    if MODEL_NAME in model_registry:
        return

    @register_model(MODEL_NAME)
    class LatteLM(HFLM):
        """lm-eval's Hugging Face model for latte folders (`--model latte`)."""

        def __init__(self, *args, **kwargs):
            hf.register()  # also in worker processes that did not import this module first
            super().__init__(*args, **kwargs)


def main(argv: list[str]) -> int:
    """Runs lm-eval's command line with `argv` after `register()`; returns its exit code."""
    register()
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval parses sys.argv itself
    try:
        cli_evaluate()
    except SystemExit as e:  # argparse (--help, bad arguments) and lm-eval's own exits
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0
