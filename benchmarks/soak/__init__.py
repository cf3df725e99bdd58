"""Workers killed and the database restarted while runs start, cancel and end:
``python -m benchmarks.soak``."""
