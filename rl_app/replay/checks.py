"""What the replay settings ask of each other and of the rest of the config, checked before
anything is created: which samplers yield sequences, the value targets and recurrent
networks that need them, slices that fit an episode and a batch, hindsight relabelling,
n-step transitions cut at a lost life."""

from __future__ import annotations

from rl_app.config import Config, ConfigError
from rl_app.envs import is_atari

SEQUENCE_SAMPLERS = ("prioritized_slice", "slice", "prioritized_sequence")
# The samplers of slices of stored steps, which n-step transitions are made of.
SLICE_SAMPLERS = ("prioritized_slice", "slice")
NSTEP_TRANSITION = "nstep_transition"
# What hindsight relabelling can relabel: transitions and slices.
HER_SAMPLERS = ("prioritized_slice", "slice", "prioritized", "uniform")


def samples_sequences(sampler: str) -> bool:
    """Whether ``replay.sampler`` yields ``[sequences, steps]`` batches (time last)."""
    return sampler in SEQUENCE_SAMPLERS


def check_value_target(config: Config) -> None:
    """Multi-step targets run along the time dimension of sampled slices; an n-step
    transition is made of a slice of stored steps (not a padded Sequence window), and it
    is one transition: neither a sequence for a recurrent network nor a slice of one goal
    for hindsight relabelling."""
    target, sampler = config.optim.target, config.replay.sampler
    if target != "td0" and not samples_sequences(sampler):
        raise ConfigError(
            f"optim.target={target!r} needs a sequence sampler (replay.sampler="
            f"{', '.join(SEQUENCE_SAMPLERS)}): replay.sampler={sampler!r} samples single steps"
        )
    if target != NSTEP_TRANSITION:
        return
    if sampler not in SLICE_SAMPLERS:
        raise ConfigError(
            f"optim.target={target!r} makes its transitions of slices: replay.sampler="
            f"{sampler!r} is not accepted; choose one of {', '.join(SLICE_SAMPLERS)}"
        )
    for setting, value, off in (
        ("network.recurrent", config.network.recurrent, "none"),
        ("replay.her_ratio", config.replay.her_ratio, 0),
    ):
        if value != off:
            raise ConfigError(
                f"{setting}={value!r} is not accepted with optim.target={target!r}, which "
                f"learns from single transitions: set {setting}={off}, or optim.target=nstep"
            )


def check_life_loss(config: Config) -> None:
    """``env.life_loss_terminal`` needs an Atari game (which has lives) and n-step
    transitions (which end at the lost life: :mod:`rl_app.replay.nstep`)."""
    if not config.env.life_loss_terminal:
        return
    if not is_atari(config.env.name):
        raise ConfigError(
            f"env.life_loss_terminal=true needs an Atari game: {config.env.name} has no lives"
        )
    if config.optim.target != NSTEP_TRANSITION:
        raise ConfigError(
            f"env.life_loss_terminal=true needs optim.target={NSTEP_TRANSITION}: "
            f"optim.target={config.optim.target!r} does not end its targets at a lost life"
        )


def check_capacity(config: Config) -> None:
    """A batch is drawn from what the buffer holds."""
    if config.optim.batch_size > config.replay.capacity:
        raise ConfigError(
            f"optim.batch_size={config.optim.batch_size} is out of range: "
            f"it must not exceed replay.capacity={config.replay.capacity}"
        )


def check_burn_in(config: Config) -> None:
    """Burn-in is a part of TorchRL's Sequence windows."""
    replay = config.replay
    if replay.burn_in and replay.sampler != "prioritized_sequence":
        raise ConfigError(
            f"replay.burn_in={replay.burn_in} needs replay.sampler=prioritized_sequence "
            f"(replay.sampler={replay.sampler!r} has no burn-in steps): set replay.burn_in=0"
        )


def check_recurrent_sequences(config: Config) -> None:
    """A recurrent network learns from sequences."""
    recurrent, sampler = config.network.recurrent, config.replay.sampler
    if recurrent != "none" and not samples_sequences(sampler):
        raise ConfigError(
            f"network.recurrent={recurrent!r} learns from sequences: "
            f"replay.sampler={sampler!r} samples single steps; choose one of "
            f"{', '.join(SEQUENCE_SAMPLERS)}"
        )


def check_hindsight(config: Config) -> None:
    """Hindsight relabelling (``replay.her_ratio``) takes transitions or slices (not
    Sequence windows) of episodes stored one after the other."""
    replay = config.replay
    if not replay.her_ratio:
        return
    her = f"replay.her_ratio={replay.her_ratio}"
    if replay.sampler == "prioritized_sequence":
        # A Sequence window (burn-in, padding) is not a slice of one goal's steps: its records
        # would take goals one by one.
        raise ConfigError(
            f"{her} is not accepted with replay.sampler='prioritized_sequence': relabelling "
            f"takes transitions or slices; set replay.sampler to one of {', '.join(HER_SAMPLERS)}"
        )
    if config.collector.mode != "direct" or config.env.num_envs != 1:
        # Relabelling finds episodes by their done flags in storage order alone.
        raise ConfigError(
            f"{her} needs each env's steps stored one after the other, as only "
            f"collector.mode=direct with env.num_envs=1 stores them (collector.mode="
            f"{config.collector.mode!r}, env.num_envs={config.env.num_envs}): episodes are "
            "found by their done flags alone, so interleaved envs would join into false episodes"
        )
    if replay.prefetch:
        # TorchRL's relabelling draws from torch's global generator, as the update does.
        raise ConfigError(
            f"replay.prefetch=true is not accepted with {her}: relabelling draws its goals "
            "from torch's global generator, which the update draws from too, so sampling in a "
            "background thread would make the run unrepeatable (set replay.prefetch=false)"
        )


def check_slices(config: Config, episode_len: int | None) -> None:
    """A sampled slice (with its burn-in) fits in an episode of at most ``episode_len``
    steps (None: no limit), and a batch is a whole number of slices."""
    replay = config.replay
    if not samples_sequences(replay.sampler):
        return
    window = replay.burn_in + replay.slice_len
    if episode_len is not None and window > episode_len:
        keys = "replay.burn_in + replay.slice_len" if replay.burn_in else "replay.slice_len"
        by = " (env.max_episode_steps)" if config.env.max_episode_steps == episode_len else ""
        raise ConfigError(
            f"{keys}={window} is out of range: {config.env.name} episodes last at most "
            f"{episode_len} steps{by}"
        )
    if config.optim.batch_size % replay.slice_len and config.optim.target != NSTEP_TRANSITION:
        raise ConfigError(
            f"optim.batch_size={config.optim.batch_size} is not accepted: with a slice "
            f"sampler it must be a multiple of replay.slice_len={replay.slice_len}"
        )
