"""The layers pass their `backend` to the ops (latte.ops.backend)."""

import pytest
import torch

from latte.layers import LatteAttention, MacchiatoAttention


@pytest.mark.parametrize("cls,kw", [(LatteAttention, {}), (MacchiatoAttention, {"window_size": 4})])
def test_layer_backend_choice(cls, kw):
    with pytest.raises(ValueError, match=r"backend: expected one of \('torch', 'fla', 'auto'\) or None"):
        cls(16, 2, 8, backend="cuda", **kw)
    x = torch.randn(2, 5, 16)
    torch.manual_seed(0)
    y_torch = cls(16, 2, 8, backend="torch", **kw)(x)[0]
    torch.manual_seed(0)
    assert torch.equal(cls(16, 2, 8, backend="auto", **kw)(x)[0], y_torch)  # auto on CPU: the torch kernels
    layer = cls(16, 2, 8, backend="fla", **kw)
    with pytest.raises(ValueError, match="backend='fla'"):
        layer(x)
    with pytest.raises(ValueError, match="backend='fla'"):
        layer(x[:, :1])  # the decoding step too
