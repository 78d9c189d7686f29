"""Pretrained decoders converted into Latte-Macchiato: the conversion
experiment and its ablations (README.md beside this file)."""
