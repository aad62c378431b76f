"""A run's bookkeeping: its directory and the lock that makes one writer of it (`directory`, `lock`), what it was
given and where it ran (`manifest`: run.json; `provenance`), its checkpoints (`checkpoint`), the metrics it writes
(`metrics_log`), what a person watching it sees (`console`, `load_watch`), the process-level setting it runs under
(`host_memory`), and the ways a step ends before it trains (`step_outcomes`: raised on the rollout side, handled
by the loop).
"""
