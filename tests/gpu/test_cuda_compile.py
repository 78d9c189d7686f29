"""The compile-heavy CUDA tests (skipped without a GPU): `torch.compile`
through inductor, whose first compiles take tens of seconds cold (43 s and
23 s for the two model tests on an H200, docs/gpu.md §5). Apart from
test_cuda.py so that a short loan runs the fast tests first
(`python -m experiments.gpu_suite --loan`, docs/gpu.md §5.3); the same
bounds as there.
"""

import pytest
import torch

from latte.ops import latte_causal
from tests.gpu import test_cuda as fast
from tests.gpu.test_cuda import CUDA, latte_inputs, needs_fla
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_fla
@pytest.mark.parametrize("T,scale,spikes", [(1, 40.0, 0.0), (300, 40.0, 0.0), (300, 1.0, 80.0)])
def test_fla_compiled_construction_matches_float64(monkeypatch, T, scale, spikes):
    """The "compiled" construction (inductor's Triton kernels for q, k, g):
    the same bounds as the eager one, and bfloat16 beside the eager result."""
    from latte.ops import backend as BK

    monkeypatch.setattr(BK, "_construction", "compiled")
    fast.test_fla_matches_float64_forward_and_gradients(T, scale, spikes)
    a, b, v = (x.to(CUDA, torch.bfloat16) for x in latte_inputs(T, scale=scale, spikes=spikes))
    y = latte_causal(a, b, v, backend="fla")[0]
    monkeypatch.setattr(BK, "_construction", "eager")
    assert y.dtype == torch.bfloat16 and rel_err(y.float(), latte_causal(a, b, v, backend="fla")[0].float()) < 2e-2


@pytest.mark.parametrize("mixer", ["latte", "macchiato"])
def test_compiled_model_on_cuda_matches_eager(mixer):
    """torch.compile of a model on the auto backend (fla's kernels are opaque
    to the compiler: one graph break per Latte layer) gives eager's loss."""
    from latte.models import LatteConfig, LatteForCausalLM

    torch.manual_seed(9)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).to(CUDA).eval()
    for layer in model.modules():
        if hasattr(layer, "backend"):
            layer.backend = "auto"
    ids = torch.randint(0, model.config.vocab_size, (2, 128), device=CUDA)
    eager = model(ids, labels=ids).loss
    compiled = torch.compile(model)(ids, labels=ids).loss
    assert abs(eager.item() - compiled.item()) < 1e-3 * abs(eager.item())
