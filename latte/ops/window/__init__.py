"""The window family: exact sliding-window softmax attention and its sinks
(docs/math.md §4, §4.1), Macchiato's local branch.

sliding_window.py  sliding_window_attention (+ _lse) and sliding_window_step, the state
window_tiles.py    the blocked kernel as an autograd Function (backend "torch")
flex_window.py     the same window on torch's flex_attention (backend "fla")
sinks.py           the first tokens of each document next to the window

The public names are exported by latte.ops; import them from there.
"""
