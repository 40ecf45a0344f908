"""Training (layer 3): learning-rate schedules (pure functions of the step), losses, the optimizer, the
non-finite guard, the resumable loop state and checkpoint averaging. The tasks' training entries live in ``tasks``."""
