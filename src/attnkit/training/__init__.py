"""Training (layer 3): the one training loop (``loop.fit``, with its optimizer step in ``step`` and the run it keeps
in ``run``), what a task gives it (``task``) and what it reports (``events``), learning-rate schedules (pure
functions of the step) and the plan a budget sizes, losses, the optimizer, the non-finite guard, the resumable loop
state, opening a run directory, and checkpoint averaging. The tasks' training entries (``train_classifier``,
``train_translator``) live in ``tasks``."""
