"""The Latte family: latent attention over a sequence (docs/math.md §2-3, §5).

minimal.py      latte_causal_minimal: the chunked form in plain torch, to read
causal.py       latte_causal (chunked) and latte_causal_step (recurrent), the state
chunked.py      the chunked kernel as an autograd Function (forward and backward)
intra_chunk.py  the sub-chunk layout, log-normalisers and diagonal blocks
gla.py          the same op on fla-core's gated linear attention (backend "fla")
bidirectional.py  latte_bidirectional (encoders)
recurrence.py   linear_recurrence, the RG-LRU scan of the qk_mixer

The public names are exported by latte.ops; import them from there.
"""
