"""The algorithm core, the part a researcher reads: the batch a step trains on (`batch`), the tensor operations
every trick shares (`ops`), the registries that name tricks and check their parameters (`registry`), the tricks
themselves (`tricks/`, one pure function each), the objective that combines them into one loss (`objective`),
how micro-batch metrics reduce to a step's (`metric_reduction`), and the mechanism diagnostics (`diagnostics/`).

It knows nothing of engines, processes or files: only torch and the config's error type.
"""
