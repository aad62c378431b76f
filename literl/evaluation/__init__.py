"""Evaluation: pass@k / avg@k / maj@k metrics, the benchmark runner, `literl eval` and `literl difficulty`.

    from literl.evaluation.evaluate import evaluate      # the runner (not re-exported here: re-exporting
                                                         # it would shadow the module of the same name)
"""

from literl.evaluation.sample_metrics import avg_at_k, k_values, maj_at_k, pass_at_k

__all__ = ["avg_at_k", "k_values", "maj_at_k", "pass_at_k"]
