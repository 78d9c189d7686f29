"""Small helpers shared by the tests (import as `from tests.helpers import ...`)."""

import torch


def rel_err(x, ref, floor=1e-12):
    """Max abs error relative to the reference's scale, max |ref| (at least
    `floor`, for quantities whose exact value is ~0 such as the gradient of
    constant logits)."""
    ref = ref.detach().double()
    return ((x.detach().double() - ref).abs().max() / ref.abs().max().clamp_min(floor)).item()


def grads_of(fn, inputs, cotangent_seed=123):
    """Gradients of <fn(*inputs), random cotangent> w.r.t. every input.

    fn returns one tensor; inputs are leaf tensors (requires_grad set here).
    """
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(cotangent_seed)
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)  # seeded on the CPU
    (out * cot).sum().backward()
    return out.detach(), [x.grad for x in leaves]
