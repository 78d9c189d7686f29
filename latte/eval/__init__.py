"""Evaluations of trained models: perplexity by position and at longer
contexts, and streaming generation. A trained run is opened with
`latte.train.runs.open_run` (eval depends on train, never the reverse).

    perplexity.py   perplexity by position bucket, extrapolation
    generation.py   token-by-token generation from the recurrent state
"""
