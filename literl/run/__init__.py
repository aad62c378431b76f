"""A run's bookkeeping: its directory and the lock that makes one writer of it (`directory`, `lock`), what it was
given and where it ran (`manifest`: run.json; `provenance`), its checkpoints (`checkpoint`), the metrics it writes
(`metrics_log`), what a person watching it sees (`console`, `load_watch`, `terminal_text`), and the process-level
setting it runs under (`host_memory`).
"""
