"""Which up-training text makes a conversion, and the shipped run's learning
curve (README.md beside this file)."""
