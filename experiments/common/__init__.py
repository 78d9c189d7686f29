"""What every experiment shares: resumable sweeps, result files and their
provenance (results.py). The library never imports it."""
