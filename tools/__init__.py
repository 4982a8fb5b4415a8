"""Tools beside the trainer: ``make bench``, ``make results`` and the SB3 baseline."""
