"""Environments: a Gymnasium env wrapped by TorchRL with the transforms every run uses.

- :func:`make_env` builds every env of a run (training, evaluation, workers) from
  ``env.*``: a seeded ``GymEnv`` with float observations, a step counter, the episode
  return and init flags; a recurrent network's state primer; the frame stacks of an Atari
  game or another env observing frames, and a game's sign-clipped rewards
  (:mod:`rl_app.envs.atari`);
- :mod:`rl_app.envs.resumable`: the episode in progress saved in checkpoints, so that a
  resume continues it;
- :mod:`rl_app.envs.goals`: the goal-conditioned envs this project ships (bit flipping, a
  2-D point), registered on import;
- :mod:`rl_app.envs.pixels`: a pixel game this project ships (a paddle kept under a
  bouncing ball), learned from frame stacks as an Atari game is, small enough for a CPU;
- :mod:`rl_app.envs.checks`: what ``env.*`` is checked against before a run starts.

To add an env: register it with Gymnasium in your own module and give ``env.name=module:id``
(as ``configs/dqn_bitflip.yaml`` does with :mod:`rl_app.envs.goals`); its action space picks
the algorithms that fit; an env observing 84x84 grayscale frames says so with a class
attribute ``observes_frames = True`` and is learned as an Atari game is
(:mod:`rl_app.envs.pixels`). A Gymnasium wrapper for every run goes in :func:`make_gym_env`, a
TorchRL transform in :func:`make_env`, a check of a new ``env.*`` setting in
:mod:`rl_app.envs.checks`; to resume mid-episode, an env offers ``get_state``/``set_state``
(:mod:`rl_app.envs.resumable`)."""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.wrappers import TimeLimit
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    InitTracker,
    ObservationNorm,
    RewardSum,
    SignTransform,
    StepCounter,
    TensorDictPrimer,
    TransformedEnv,
)
from torchrl.envs.gym_like import BaseInfoDictReader

from rl_app.config import EnvConfig, NetworkConfig
from rl_app.envs.resumable import ResumableEnv

# Evaluation episodes use seeds far from the training ones, so that the agent is scored on
# starts it did not necessarily train from.
EVAL_SEED_OFFSET = 1_000_003
# A recurrent policy's state, one entry per LSTM state tensor: the env carries it (a primer
# adds it to the specs, zeros at every reset), so every stored frame holds the state its
# action was taken with, under these keys, and the one after it under ("next", key).
RECURRENT_STATE_KEYS = ("recurrent_state_h", "recurrent_state_c")
# ObservationNorm's statistics come from this many steps of random play, from this seed, in
# every env of every run: all of a run's envs (workers, evaluation, play) normalize alike.
NORMALIZATION_FRAMES = 2_000
NORMALIZATION_SEED = 0
# An Atari game observes one 84x84 grayscale frame (uint8) under FRAME_KEY; the Q-network
# reads the newest FRAME_STACK of them under PIXELS_KEY, oldest first, as in Mnih et al.
# (2015). An episode ends at ATARI_MAX_FRAMES emulator frames (30 minutes of play, 27,000
# agent steps of 4 frames), the standard cap since Machado et al. (2018).
FRAME_KEY = "frame"
PIXELS_KEY = "pixels"
FRAME_STACK = 4
FRAME_SIZE = 84
FRAME_SKIP = 4
ATARI_MAX_FRAMES = 108_000
# A goal env says in info["is_success"] whether a step reached its goal (gymnasium-robotics'
# convention); its TorchRL env writes that with each step, under SUCCESS_KEY.
SUCCESS_KEY = "is_success"
# With env.life_loss_terminal, an Atari game says with each step whether it lost a life,
# under LIFE_LOST: stored with every transition, it ends n-step transitions there
# (rl_app.replay.nstep).
LIFE_LOST = "life_lost"
# Collector i (a worker process or a collection job) seeds its env with seed + i * stride:
# distinct, reproducible episodes.
WORKER_SEED_STRIDE = 10_007
# Gymnasium's entry point of every Atari game (ale_py).
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


def worker_seed(seed: int, worker: int) -> int:
    """The env seed of collector ``worker`` in a run seeded with ``seed``."""
    return seed + worker * WORKER_SEED_STRIDE


def is_registered(env_id: str) -> bool:
    """Whether Gymnasium knows ``env_id``. It learns the ids of the Atari games (e.g.
    BreakoutNoFrameskip-v4) from ale_py, imported here at the first id it does not know
    rather than by every run (it takes a quarter of a second)."""
    if env_id not in gym.envs.registry:
        import ale_py

        gym.register_envs(ale_py)
        # Its banner would stand before a refusal's one line; its errors still print.
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    return env_id in gym.envs.registry


def is_atari(env_name: str) -> bool:
    """Whether ``env.name`` is a game of the Arcade Learning Environment."""
    env_id = env_name.split(":")[-1]
    return is_registered(env_id) and gym.spec(env_id).entry_point == ATARI_ENTRY_POINT


def observes_frames(env_name: str) -> bool:
    """Whether ``env.name`` is learned as an Atari game is, from stacks of its frames: an
    Atari game, or an env whose class says so with ``observes_frames = True`` (its
    observation one 84x84 uint8 grayscale frame, as :mod:`rl_app.envs.pixels`'s)."""
    if is_atari(env_name):
        return True
    module, _, env_id = env_name.rpartition(":")
    if module:  # registers its ids on import, which a new process has not done yet
        importlib.import_module(module)
    if not is_registered(env_id):
        return False
    creator = gym.spec(env_id).entry_point
    if isinstance(creator, str):
        creator = load_env_creator(creator)
    return bool(getattr(creator, "observes_frames", False))


class ObservationIndices(gym.ObservationWrapper):
    """Observes only some entries of a flat Box observation (``env.observation_indices``):
    e.g. CartPole's positions without its velocities, a partially observed task."""

    holds_episode_state = False  # rl_app.envs.resumable: nothing to save mid-episode

    def __init__(self, env: gym.Env, indices: list[int]) -> None:
        super().__init__(env)
        self.indices = np.asarray(indices)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low[self.indices], space.high[self.indices], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.indices]


class FlagReader(BaseInfoDictReader):
    """Writes the info's ``flags`` (each a bool or a NumPy number, or one per env of a vector
    env) under their own names, False where the info has none (after a reset). TorchRL's
    default reader takes NumPy values only."""

    def __init__(self, flags: list[str], batch_size: torch.Size) -> None:
        self.flags = flags
        self.batch_size = batch_size

    def __call__(self, info_dict: dict[str, Any], tensordict: Any) -> Any:
        for flag in self.flags:
            value = torch.as_tensor(np.asarray(info_dict.get(flag, False), dtype=bool))
            tensordict.set(flag, value.expand(self.batch_size).reshape(*self.batch_size, 1))
        return tensordict

    @property
    def info_spec(self) -> Composite:
        flag = Categorical(2, shape=(*self.batch_size, 1), dtype=torch.bool)
        return Composite({name: flag.clone() for name in self.flags}, shape=self.batch_size)


def make_gym(env_name: str, **kwargs: Any) -> gym.Env:
    """``gym.make`` of ``env.name`` (``module:id`` imports ``module``, which registers
    ``id``). A MuJoCo env's warnings go to the ``mujoco`` logger, not to stdout and a
    MUJOCO_LOG.TXT in the working directory."""
    module, _, env_id = env_name.rpartition(":")
    if module:
        importlib.import_module(module)
    if "mujoco" in str(gym.spec(env_id).entry_point).lower():
        import mujoco

        mujoco.set_mju_user_warning(log_mujoco_warning)
    return gym.make(env_id, **kwargs)


def log_mujoco_warning(message: str) -> None:
    # A deprecation in the model files Gymnasium ships is nothing a user can act on.
    level = logging.DEBUG if " is deprecated" in message else logging.WARNING
    logging.getLogger("mujoco").log(level, message)


def make_gym_env(env: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """The Gymnasium env ``env.name`` (an Atari game preprocessed as :func:`make_atari_env`
    says), observing ``env.observation_indices`` if set, its episodes cut at
    ``env.max_episode_steps`` if set."""
    if is_atari(env.name):
        from rl_app.envs.atari import make_atari_env

        gym_env = make_atari_env(env, render_mode)
    else:
        gym_env = make_gym(env.name, render_mode=render_mode)
    if env.observation_indices is not None:
        gym_env = ObservationIndices(gym_env, env.observation_indices)
    if env.max_episode_steps is not None:
        gym_env = TimeLimit(gym_env, env.max_episode_steps)
    return gym_env


def recurrent_state_primer(network: NetworkConfig) -> TensorDictPrimer:
    """Puts the recurrent state of ``network`` (one LSTM layer) into the env's specs."""
    shape = (1, network.lstm_size)
    return TensorDictPrimer(
        {key: Unbounded(shape=shape) for key in RECURRENT_STATE_KEYS}, expand_specs=True
    )


def make_env(
    env: EnvConfig,
    seed: int,
    device: str | torch.device = "cpu",
    render_mode: str | None = None,
    network: NetworkConfig | None = None,
) -> EnvBase:
    """One seeded environment: float observations, a step counter, the episode return
    (``episode_reward``) and ``is_init`` flags at episode starts; with a recurrent
    ``network``, also the policy's recurrent state (``RECURRENT_STATE_KEYS``); a goal env
    also says whether each step reached its goal (SUCCESS_KEY), and an Atari game with
    ``env.life_loss_terminal`` whether it lost a life (LIFE_LOST).

    An Atari game, and any env that observes frames as one does (:func:`observes_frames`),
    observes uint8 frames instead (:func:`rl_app.envs.atari.frame_stacking`); a game's
    reward the learner sees is clipped to its sign (Mnih et al., 2015), after
    ``episode_reward`` has summed the game's score: training and evaluation returns are
    scores.

    With ``env.num_envs > 1`` it is a batch of envs stepped together in this process (a
    Gymnasium ``SyncVectorEnv``): one policy call and one TorchRL step serve them all. Its
    envs reset one by one when their episodes end (TorchRL asks for partial resets, so the
    vector env's own autoreset is off). ``render_mode`` (one env only) is Gymnasium's, e.g.
    ``"rgb_array"`` for videos."""
    if env.num_envs == 1:
        gym_env = ResumableEnv(make_gym_env(env, render_mode))
    else:
        gym_env = gym.vector.SyncVectorEnv(
            [functools.partial(make_gym_env, env)] * env.num_envs,
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,
        )
    base = GymWrapper(gym_env, device=device)
    flags = [SUCCESS_KEY] if "desired_goal" in base.observation_spec.keys() else []
    if env.life_loss_terminal:
        flags.append(LIFE_LOST)
    if flags:
        base.set_info_dict_reader(FlagReader(flags, base.batch_size))
    transforms = [DoubleToFloat(), StepCounter(), RewardSum(), InitTracker()]
    if observes_frames(env.name):
        from rl_app.envs.atari import frame_stacking

        transforms = [*frame_stacking(), *transforms]
    if is_atari(env.name):
        transforms.append(SignTransform(in_keys=["reward"]))
    if network is not None and network.recurrent != "none":
        transforms.append(recurrent_state_primer(network))
    transformed = TransformedEnv(base, Compose(*transforms))
    if env.normalize_observations:
        loc, scale = observation_statistics(env.name, tuple(env.observation_indices or ()))
        transformed.append_transform(
            # Copies: each env owns its buffers (a state_dict load writes into them).
            ObservationNorm(
                loc.clone(), scale.clone(), in_keys=["observation"], standard_normal=True
            )
        )
    transformed.set_seed(seed)
    return transformed


@functools.cache
def observation_statistics(
    name: str, observation_indices: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of the observations of env ``name`` (observing
    ``observation_indices``, all if empty) over ``NORMALIZATION_FRAMES`` steps of random play
    in one env seeded ``NORMALIZATION_SEED`` (TorchRL's ``init_stats``), drawn apart from the
    global random state: the same for every env of a run. Played once per process: later
    envs (each evaluation's, a worker's) reuse them."""
    probe = make_env(
        EnvConfig(name=name, observation_indices=list(observation_indices) or None),
        NORMALIZATION_SEED,
    )
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    probe.append_transform(norm)
    with torch.random.fork_rng():
        torch.manual_seed(NORMALIZATION_SEED)
        norm.init_stats(NORMALIZATION_FRAMES, reduce_dim=0, cat_dim=0)
    probe.close()
    return norm.loc.clone(), norm.scale.clone()


def env_factory(
    env: EnvConfig,
    seed: int,
    device: str | torch.device = "cpu",
    network: NetworkConfig | None = None,
) -> Callable[[], EnvBase]:
    """A picklable zero-argument factory, as collectors expect."""
    return functools.partial(make_env, env, seed, device, network=network)
