"""nn.Modules that own parameters, project and reshape, and call `latte.ops`.

Every attention layer has the same interface, so comparisons are like for like:

    y, state = layer(x, state=None, mask=None)

x [B, T, dim]; mask [B, T] bool (False = padding, e.g. left padding in
batched generation); y [B, T, dim]; state is the decoding state after the last
token (None for bidirectional layers). Passing it back with the next tokens
continues exactly: prefill + token-by-token decode == one full forward.
RoPE positions count real tokens only, carried in `state.pos` [B].
`state_nbytes(state)` is constant in the context length for every layer except
SoftmaxAttention (KV cache).
"""

from ._common import real_positions, state_nbytes
from .latte_attention import LatteAttention, LatteLayerState
from .linear_attention import LinearAttention, LinearLayerState
from .macchiato_attention import MacchiatoAttention, MacchiatoLayerState
from .mixers import RGLRU, DepthwiseConv, QKMixer, sqrt_bounded_grad
from .rope import RotaryEmbedding
from .sliding_window_attention import SlidingWindowAttention, WindowLayerState
from .softmax_attention import KVCache, SoftmaxAttention

__all__ = [
    "DepthwiseConv",
    "KVCache",
    "LatteAttention",
    "LatteLayerState",
    "LinearAttention",
    "LinearLayerState",
    "MacchiatoAttention",
    "MacchiatoLayerState",
    "QKMixer",
    "RGLRU",
    "RotaryEmbedding",
    "SlidingWindowAttention",
    "SoftmaxAttention",
    "WindowLayerState",
    "real_positions",
    "sqrt_bounded_grad",
    "state_nbytes",
]
