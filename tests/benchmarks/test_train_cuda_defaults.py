"""`latte bench train`'s training step on CUDA, as far as the CPU can see it:
bf16 autocast, fused AdamW and 65,536 tokens a step by default there, the
CPU's defaults unchanged (docs/gpu.md §5)."""

from benchmarks import train


def test_cuda_defaults_size_the_step_and_fuse_adamw():
    cuda = train.parse_args(["--device", "cuda", "--mixers", "latte,softmax"])
    assert (cuda.tokens_per_step, cuda.dtype) == (train.CUDA_TOKENS, "bfloat16") == (65536, "bfloat16")
    assert train.fused_optimizer("cuda") is True


def test_cpu_defaults_are_unchanged():
    cpu = train.parse_args(["--mixers", "latte"])
    assert (cpu.tokens_per_step, cpu.dtype) == (4096, "float32")
    assert train.fused_optimizer("cpu") is None  # AdamW's own default (foreach)
    assert train.parse_args(["--device", "cuda", "--tokens-per-step", "512"]).tokens_per_step == 512
