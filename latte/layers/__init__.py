"""nn.Modules that own parameters, project and reshape, and call `latte.ops`.

Every attention layer has the same interface, so comparisons are like for like:

    y, state = layer(x, state=None, mask=None, positions=None)

x [B, T, dim]; mask [B, T] bool (False = padding, e.g. left padding in
batched generation); y [B, T, dim]; state is the decoding state after the last
token (None for bidirectional layers). Passing it back with the next tokens
continues exactly: prefill + token-by-token decode == one full forward.
positions [B, T]: the RoPE positions, given by a model (which counts them
once for all layers); left out, a layer with RoPE counts real tokens itself
in `state.pos` [B]. `state_nbytes(state)` is constant in the context length
for every layer except SoftmaxAttention (KV cache); the window layers' state
grows with the first window_size - 1 positions, then stays constant.
"""

from .latte_attention import LatteAttention, LatteLayerState
from .linear_attention import LinearAttention, LinearLayerState
from .macchiato_attention import MacchiatoAttention, MacchiatoLayerState
from .mixers import QK_MIXERS, RGLRU, DepthwiseConv, QKMixer
from .rope import RotaryEmbedding
from .sliding_window_attention import SlidingWindowAttention, WindowLayerState
from .softmax_attention import KVCache, SoftmaxAttention, StaticKVCache
from .states import state_nbytes

__all__ = [
    "DepthwiseConv",
    "KVCache",
    "LatteAttention",
    "LatteLayerState",
    "LinearAttention",
    "LinearLayerState",
    "MacchiatoAttention",
    "MacchiatoLayerState",
    "QK_MIXERS",
    "QKMixer",
    "RGLRU",
    "RotaryEmbedding",
    "SlidingWindowAttention",
    "SoftmaxAttention",
    "StaticKVCache",
    "WindowLayerState",
    "state_nbytes",
]
