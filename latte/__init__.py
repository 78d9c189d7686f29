"""Latte: linear-time latent attention for PyTorch (arXiv 2402.17512)."""

__version__ = "0.1.0"
