"""Problem sets (files, benchmark names, hub datasets) and prompt templates."""

from literl.data.benchmarks import benchmark_names, register_benchmark
from literl.data.problems import DataWarning, ProblemSet, load_problems
from literl.data.prompts import TEMPLATES, render_prompt, render_prompt_text

__all__ = ["benchmark_names", "register_benchmark", "DataWarning", "ProblemSet", "load_problems", "TEMPLATES",
           "render_prompt", "render_prompt_text"]
