"""ListOps and Pathfinder-32 of the Long Range Arena (README.md beside this file)."""
