"""RoPE: identity at position 0, norm-preserving, relative, Llama's layout."""

import pytest
import torch

from latte.layers import RotaryEmbedding
from latte.layers.rope import real_positions


def test_position_zero_is_identity_and_norm_is_preserved():
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 5, 3, 8)
    torch.testing.assert_close(rope(x, torch.zeros(2, 5, dtype=torch.long)), x)
    pos = torch.randint(0, 1000, (2, 5))
    torch.testing.assert_close(rope(x, pos).norm(dim=-1), x.norm(dim=-1))


def test_scores_depend_on_relative_position_only():
    rope = RotaryEmbedding(16, theta=500.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (rope(q, torch.tensor([[m]])) * rope(k, torch.tensor([[n]]))).sum()

    torch.testing.assert_close(score(7, 3), score(107, 103), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score(7, 3), score(7, 4))


def test_matches_llama_rotate_half():
    E, theta = 8, 10000.0
    x = torch.randn(1, 4, 2, E, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 5, 9]])
    inv = 1.0 / theta ** (torch.arange(0, E, 2, dtype=torch.float64) / E)
    ang = torch.cat([pos[..., None] * inv] * 2, -1)[:, :, None]  # [1, 4, 1, E]
    x1, x2 = x.chunk(2, -1)
    ref = x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()
    torch.testing.assert_close(RotaryEmbedding(E, theta)(x, pos), ref.to(x.dtype), atol=1e-6, rtol=1e-6)


def test_survives_module_dtype_cast():
    rope = RotaryEmbedding(8).to(torch.bfloat16)
    x = torch.randn(1, 2, 1, 8).to(torch.bfloat16)
    out = rope(x, torch.tensor([[3000, 3001]]))
    assert out.dtype == torch.bfloat16
    assert rope.theta == 10000.0 and list(rope.buffers()) == []


def test_odd_head_dim_raises():
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(7)


def test_real_positions_skip_padding_and_continue_from_state():
    mask = torch.tensor([[False, False, True, True], [True, False, True, True]])
    pos, after = real_positions(mask, torch.tensor([0, 10]), 2, 4, "cpu")
    assert pos[0, 2:].tolist() == [0, 1]
    assert pos[1].tolist() == [10, 11, 11, 12]  # the padded token takes no position
    assert after.tolist() == [2, 13]
    pos, after = real_positions(None, None, 1, 3, "cpu")
    assert pos.tolist() == [[0, 1, 2]] and after.tolist() == [3]
