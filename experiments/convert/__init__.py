"""Pretrained decoders converted into Latte-Macchiato: the shipped
conversion evaluated against the original and its window (README.md
beside this file)."""
