"""Learning checks: the shipped presets really learn. Minutes each, so marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_app.config import load_config
from rl_app.loop import train


@pytest.mark.slow
def test_default_sac_solves_pendulum_within_20k_frames(tmp_path: Path) -> None:
    config = load_config("default", [f"run_dir={tmp_path / 'run'}", "logger.backend=none"])
    assert config.collector.total_frames == 20_000 and config.eval.episodes == 10
    result = train(config)
    assert result.frames == 20_000
    assert result.best_eval_reward >= -200, result
    # A random policy scores about -1200; the final policy must still be a learned one.
    assert result.last_eval_reward >= -400, result


@pytest.mark.slow
def test_dqn_preset_ends_with_a_learned_cartpole_policy(tmp_path: Path) -> None:
    config = load_config("dqn_cartpole", [f"run_dir={tmp_path / 'run'}", "logger.backend=none"])
    assert config.collector.total_frames <= 50_000 and config.eval.episodes == 10
    result = train(config)
    # The final policy, not the best one seen, must be a learned one (a random policy
    # scores about 20). Seed 0 ends at 481; over seeds 1-5 the preset ends at 420-485 (see
    # the README), short of holding 475 in every seed.
    assert result.last_eval_reward >= 400, result
