"""Small helpers shared by the tests (import as `from tests.helpers import ...`)."""

import torch


def tiny_llama(vocab_size: int, max_positions: int = 256):
    """A tiny random transformers Llama (seed 0: 2 layers, width 32, 4 query
    heads sharing 2 KV heads): the stand-in base model of the conversion and
    evaluation tests. Needs transformers."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    return transformers.LlamaForCausalLM(cfg)


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
