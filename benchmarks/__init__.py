"""The benchmarks only this repository runs; the files they and `latte bench
ops|decode|check` wrote are in results/ (README.md here holds their tables).
Each is `python -m benchmarks.NAME` from the repository root:

    train.py   tokens/s of one AdamW step per mixer (train_report.py: tables; step_profile.py: top ops)
    window.py  Macchiato's window branch: tile kernel vs flex_attention
    distill.py conversion's objective: whole logits vs chunks of the head
    audit.py   each op's time on every input distribution (latte.ops.distributions)
    memory.py  one Macchiato layer without and with memory slots, prefill and decode
    hf_decode.py the Hugging Face adapters' generate: latte's static step vs transformers' loop

They import `latte` (latte.bench's timing, device and provider helpers);
`latte` never imports them (tests/test_package.py).
"""

RESULTS = "benchmarks/results"  # the committed outputs: each script's default --out
