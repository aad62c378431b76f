"""Building a run: the one place that wires the model, the rollout engine, the learner, the objective and the
run's bookkeeping together (`components`), with the policy's loading (`model_loading`), the training problems
(`training_set`), the size checks made before anything slow starts (`limits`), and the Python entry point
`literl.train` (`api`). It sits above `literl.rollout` and `literl.training`, which never import each other.
"""
