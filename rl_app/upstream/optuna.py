"""Optuna 5.0.0: a trial taken up again from its stored record (the index is in
:mod:`rl_app.upstream`)."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, Trial


def resumed_trial(study: optuna.Study, frozen: FrozenTrial) -> Trial:
    """A :class:`Trial` that reports to, and is told the end of, the stored trial ``frozen``
    (one a killed worker left RUNNING).

    Optuna builds a ``Trial`` from the trial's id in its storage, which ``FrozenTrial``
    keeps private (``_trial_id``); its public ``number`` counts within the study only.
    Test: ``test_a_frozen_trial_keeps_its_storage_id_private``."""
    return Trial(study, frozen._trial_id)
