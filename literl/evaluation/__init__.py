"""Evaluation: pass@k / avg@k / maj@k metrics, the benchmark runner, `literl eval` and `literl difficulty`."""

from literl.evaluation.evaluate import evaluate, flat_metrics, print_results, results_table
from literl.evaluation.metrics import avg_at_k, k_values, maj_at_k, pass_at_k

__all__ = ["evaluate", "flat_metrics", "print_results", "results_table", "avg_at_k", "k_values", "maj_at_k",
           "pass_at_k"]
