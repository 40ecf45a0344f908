"""``attnkit.classify``: the classifier's inference API for users (``from attnkit.classify import ClassifierRun``).

A re-export of ``attnkit.tasks.classify``; nothing inside attnkit imports this module.
"""

from attnkit.tasks.classify import ClassifierRun, Prediction

__all__ = ["ClassifierRun", "Prediction"]
