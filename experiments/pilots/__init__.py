"""The recipe pilots of docs/conversion.md §12: their retrieval table and
learning curve (README.md beside this file)."""
