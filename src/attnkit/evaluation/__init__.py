"""Metrics: accuracy and macro-F1 for classifiers, BLEU and chrF (through sacreBLEU) for translators."""
