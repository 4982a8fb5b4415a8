"""Each algorithm's own group of settings, under its ``algo=`` name in a run's config
(:class:`~rl_app.config.schema.RunConfig`): what its module in :mod:`rl_app.algorithms`
reads as ``config.<name>``."""

from __future__ import annotations

from dataclasses import dataclass

from rl_app.config.settings import setting


@dataclass
class SACConfig:
    """SAC's own settings (algo=sac)."""

    tau: float = setting(0.005, "soft target-network update rate", above=0, at_most=1)
    init_alpha: float = setting(1.0, "initial entropy temperature (learned from there)", above=0)
    vmap_qnets: bool = setting(
        False,
        "run the Q-networks under torch.vmap (off: one after the other, which measured faster "
        "on CPUs and gives the same values up to float rounding); always on with optim.compile",
        on_resume=True,
    )


@dataclass
class DQNConfig:
    """DQN's own settings (algo=dqn)."""

    eps_start: float = setting(1.0, "exploration epsilon at the start", at_least=0, at_most=1)
    eps_end: float = setting(0.05, "exploration epsilon after annealing", at_least=0, at_most=1)
    eps_annealing_frames: int = setting(
        10_000, "frames over which epsilon decreases linearly", at_least=1
    )
    target_update_interval: int = setting(
        10, "copy the Q-network to its target every N updates", at_least=1
    )
    loss: str = setting("l2", "TD loss: l2 | smooth_l1 (Huber)", choices=("l2", "smooth_l1"))
    double: bool = setting(True, "double DQN: the online network picks the next action")
    max_grad_norm: float = setting(
        10.0, "clip each update's gradient norm to this (0: no clipping)", at_least=0
    )
    eval_eps: float = setting(
        0.0,
        "epsilon of evaluation episodes, and of playing a run (0: greedy)",
        at_least=0,
        at_most=1,
    )
    random_shift: int = setting(
        0,
        "shift each sampled observation and next observation by up to N pixels (edge-padded, "
        "randomly cropped back; DrQ), independently (0: none; envs of frames only)",
        at_least=0,
    )
    dueling: bool = setting(
        False,
        "a dueling head (Wang et al., 2016; TorchRL's DuelingCnnDQNet): a state value and an "
        "advantage per action, each from its own 512-unit layer (envs of frames only)",
    )
    channels_last: bool = setting(
        True,
        "run the Nature CNN in the channels-last memory format (faster updates on the CPUs "
        "measured, docs/speed.md; envs of frames only)",
    )


@dataclass
class TD3Config:
    """TD3's own settings (algo=td3)."""

    tau: float = setting(0.005, "soft target-network update rate", above=0, at_most=1)
    policy_delay: int = setting(
        2, "update the actor and the target networks at every N-th critic update", at_least=1
    )
    exploration_noise: float = setting(
        0.1,
        "std of the Gaussian noise added to collected actions, in half-widths of the action "
        "range (then clipped to it)",
        at_least=0,
    )
    policy_noise: float = setting(
        0.2,
        "std of the noise that smooths the target action, in half-widths of the action range",
        at_least=0,
    )
    noise_clip: float = setting(
        0.5, "clip the target action's noise to +-N half-widths of the action range", at_least=0
    )
