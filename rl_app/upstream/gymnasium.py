"""Gymnasium 1.4: a private name of its ``TimeLimit`` wrapper (the index is in
:mod:`rl_app.upstream`)."""

from __future__ import annotations

from gymnasium.wrappers import TimeLimit


def set_elapsed_steps(wrapper: TimeLimit, steps: int) -> None:
    """Set how many steps of the episode ``wrapper`` has counted towards its limit, in its
    private ``_elapsed_steps``: a resumed episode continues its count (it has no public
    setter). Test: ``test_time_limit_still_counts_steps_in_a_private_attribute``."""
    wrapper._elapsed_steps = steps
