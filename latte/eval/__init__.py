"""Evaluations of trained models: perplexity (overall, by position, at longer
contexts), streaming generation, and opening a training run's checkpoint.

    perplexity.py   nll sums, perplexity by position bucket, extrapolation
    generation.py   token-by-token generation from the recurrent state
    runs.py         newest verified checkpoint + config + tokenizer of a run
"""
