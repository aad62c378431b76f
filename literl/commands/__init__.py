"""The `literl <command>` implementations, one module per command (`literl/cli.py` maps names to them): each exposes
`add_arguments(parser)` and `run(args) -> int` (or `add_<command>_arguments` / `run_<command>` when one module
serves several commands) and is imported only when its command runs.
"""
