"""Training: learning-rate schedules (pure functions of the step), losses, run directories, and the loops."""
