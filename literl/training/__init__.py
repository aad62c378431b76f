"""The update side of a run: the loop (`trainer`), the learner that runs the forward/backward and the optimizer
step (`learner`), the optimizer and schedule (`optim`), and when a step carries no learning signal
(`learning_signal`).
"""
