"""Deterministic evaluation through TorchRL's ``Evaluator``: its episodes played side by
side, one per env of a batch."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase, SerialEnv, Transform, TransformedEnv

from rl_app.config import Config
from rl_app.envs import EVAL_SEED_OFFSET, SUCCESS_KEY, make_env
from rl_app.logger import EVAL_KEY, SUCCESS_RATE_KEY
from rl_app.upstream.torchrl import close_keeping_threads, gymnasium_env, keeping_threads

# Steps of the whole batch per collection of the Evaluator's collector, which holds them
# all in memory: fewer collections cost calls of their own (docs/speed.md, "Episodes as a
# batch").
STEPS_PER_COLLECTION = 4


@dataclasses.dataclass
class Episodes:
    returns: torch.Tensor  # float32, one per episode
    reached_goal: torch.Tensor | None  # in a goal env: whether each one's last step did


def no_stop() -> None:
    """An abandon point that never abandons: evaluation with no stop to heed."""


def evaluate(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    policy: TensorDictModuleBase,
    abandon_point: Callable[[], None] = no_stop,
) -> dict[str, float]:
    """Mean return (``EVAL_KEY``) of ``eval.episodes`` episodes played with ``policy``'s
    current weights and its deterministic action (the mode of its distribution); in a goal
    env, also the share of them whose last step reached the goal (``SUCCESS_RATE_KEY``).

    A copy of the policy (from ``policy_factory``) plays, so evaluation never touches the
    learner's modules. Every evaluation plays the same seeded episodes (:func:`play_episodes`),
    so that scores compare across evaluations and across resumes.

    ``abandon_point`` is called between its steps, and may raise to drop it
    (:meth:`rl_app.interrupts.StopRequest.abandon_point`)."""
    abandon_point()
    return evaluate_weights(config, policy_factory, policy.state_dict(), abandon_point)


def evaluate_weights(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    weights: dict[str, torch.Tensor],
    abandon_point: Callable[[], None] = no_stop,
) -> dict[str, float]:
    """:func:`evaluate`'s scores for a policy with ``weights``: what an evaluation beside
    training plays, in its own process or Ray actor."""
    actor = policy_factory()
    actor.load_state_dict(weights)
    return scores(play_episodes(config, actor, config.eval.episodes, abandon_point=abandon_point))


def scores(episodes: Episodes) -> dict[str, float]:
    found = {EVAL_KEY: episodes.returns.mean().item()}
    if episodes.reached_goal is not None:
        found[SUCCESS_RATE_KEY] = episodes.reached_goal.double().mean().item()  # 9 of 10: 0.9
    return found


def play_episodes(
    config: Config,
    policy: TensorDictModuleBase,
    episodes: int,
    seed: int | None = None,
    abandon_point: Callable[[], None] = no_stop,
) -> Episodes:
    """The first ``episodes`` evaluation episodes (with ``seed``, those of an evaluation
    seeded so), played by ``policy`` deterministically through TorchRL's ``Evaluator``, in a
    batch of envs: episode k in env k (:func:`episode_env`), which takes no step once its
    episode has ended (:class:`FirstEpisodeOnly`).

    The policy acts on the whole batch at every step. Where it still explores
    (``dqn.eval_eps``), it draws from torch's generator seeded with the env seed, so
    episode k's draws depend only on k and on ``episodes``, not on the learner's state."""
    seed = evaluation_seed(config) if seed is None else seed
    starts = episode_starts(config, seed, episodes, abandon_point)
    # One factory for all (with each env's own arguments): SerialEnv then builds one env,
    # not each, to learn their specs.
    batch = SerialEnv(
        episodes,
        functools.partial(episode_env, config, seed, abandon_point=abandon_point),
        create_env_kwargs=[{"index": k, "start": start} for k, start in enumerate(starts)],
    )
    evaluator = None
    with keeping_threads():  # every close of the batch, a collector's that raised too
        try:
            with torch.random.fork_rng():
                evaluator = Evaluator(
                    TransformedEnv(batch, FirstEpisodeOnly(seed, abandon_point)),
                    policy,
                    num_trajectories=episodes,
                    frames_per_batch=episodes * STEPS_PER_COLLECTION,
                    # Only what the scores need is kept of each step: not a game's frames.
                    collector_kwargs={"traj_format": "cat", "postproc": episode_keys},
                    metrics_fn=outcomes,
                    dump_video=False,
                )
                result = evaluator.evaluate()
        finally:
            if evaluator is not None:
                evaluator.shutdown()  # its collector closes the batch
            close_keeping_threads(batch)  # where the collector was never built
    return Episodes(result["eval/returns"], result.get("eval/reached_goal"))


class BackgroundEvaluator:
    """Evaluations played while training goes on (``eval.backend=process``), one at a time,
    in a process of its own that plays one after another (its imports are paid once,
    beside training; a cancelled evaluation's process is killed, and the next start makes
    a new one). Each is played by a policy with the weights given to :meth:`start`,
    those of the policy when the evaluation was due: the episodes :func:`evaluate` plays.

    A process, not a thread: TorchRL's exploration type (random or deterministic actions)
    is one value per process, which a collector and an evaluator in two threads would set
    under each other. The ``Evaluator``'s own ``process`` backend is not enough for that:
    it drives its worker from a thread of this process, under ``set_exploration_type``. In
    the process, the ``Evaluator`` plays the episodes as a blocking evaluation does.

    A subclass plays them elsewhere by overriding :meth:`start_worker`, :meth:`send`,
    :meth:`scores` and :meth:`close` (:class:`rl_app.ray_evaluation.RayEvaluator`)."""

    def __init__(self, config: Config, policy_factory: Callable[..., TensorDictModuleBase]) -> None:
        self.config, self.policy_factory = config, policy_factory
        self.worker: Any = None  # the process (or actor) that plays them
        self.playing = False
        self.start_worker()

    def start_worker(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.jobs, worker_end = context.Pipe()
        # On the learner's thread count, as a blocking evaluation: the same float rounding.
        arguments = (self.config, self.policy_factory, torch.get_num_threads(), worker_end)
        self.worker = context.Process(
            target=evaluation_worker, args=arguments, name="rl_app-evaluation", daemon=True
        )
        self.worker.start()
        worker_end.close()

    def start(self, weights: dict[str, torch.Tensor]) -> None:
        """Start an evaluation of a policy with ``weights`` (CPU tensors: a tensor sent to
        a process is shared with it, so they must not change until it ends)."""
        if self.worker is None:
            self.start_worker()
        self.send(weights)
        self.playing = True

    def send(self, weights: dict[str, torch.Tensor]) -> None:
        self.jobs.send(weights)

    def scores(self, timeout: float | None = 0) -> dict[str, float] | None:
        """The scores of the evaluation playing, once it has ended (waiting up to
        ``timeout`` seconds), else None. An error it raised is raised here, with its
        traceback."""
        if not self.jobs.poll(timeout):
            return None
        try:
            outcome = self.jobs.recv()
        except EOFError:
            self.worker.join()
            raise RuntimeError(
                f"the evaluation process ended without a result (exit code {self.worker.exitcode})"
            ) from None
        self.playing = False
        if isinstance(outcome, str):
            raise RuntimeError(f"the evaluation failed in its process:\n{outcome}")
        return outcome

    def cancel(self) -> None:
        """Drop the evaluation playing at once, with its worker (the next starts another)."""
        self.close()
        self.worker, self.playing = None, False

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker.join()
            self.jobs.close()


def evaluation_worker(
    config: Config,
    policy_factory: Callable[..., TensorDictModuleBase],
    threads: int,
    jobs: Connection,
) -> None:
    """A :class:`BackgroundEvaluator`'s process: for each set of weights it receives, the
    scores of their evaluation, or the traceback of its error; it ends with its run."""
    # A Ctrl-C in a terminal, or a SIGTERM to the whole job, reaches this process too: the
    # run heeds it, and drops the evaluation playing here itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    while True:
        try:
            weights = jobs.recv()
        except EOFError:
            return
        try:
            outcome: dict[str, float] | str = evaluate_weights(
                config, policy_factory, weights, abandon_point=end_if_orphaned
            )
        except Exception:
            outcome = traceback.format_exc()
        jobs.send(outcome)


def end_if_orphaned() -> None:
    """End this process at once if the run that started it is gone (killed)."""
    if not multiprocessing.parent_process().is_alive():
        os._exit(1)


# What a trajectory keeps for the scores (SUCCESS_KEY in goal envs only).
EPISODE_KEYS = (
    ("next", "done"), ("next", "episode_reward"), ("next", SUCCESS_KEY), ("collector", "traj_ids"),
)  # fmt: skip


def episode_keys(steps: TensorDictBase) -> TensorDictBase:
    return steps.select(*EPISODE_KEYS, strict=False)


def outcomes(trajectories: TensorDictBase) -> dict[str, torch.Tensor]:
    """The evaluator's metrics (``eval/<name>`` in its result): each episode's return and,
    in a goal env, whether its last step reached the goal, in the order of the envs: the
    evaluator numbers its first trajectories so."""
    ends = trajectories["next", "done"].reshape(-1)
    order = trajectories["collector", "traj_ids"].reshape(-1)[ends].argsort()
    found = {"returns": trajectories["next", "episode_reward"].reshape(-1)[ends][order]}
    if ("next", SUCCESS_KEY) in trajectories.keys(include_nested=True):
        found["reached_goal"] = trajectories["next", SUCCESS_KEY].reshape(-1)[ends][order]
    return found


class FirstEpisodeOnly(Transform):
    """Over a batch of envs: each plays its first episode after a full reset and takes no
    step after it ended (TorchRL's partial steps, ``"_step"``), so that an evaluator
    collecting as many trajectories as there are envs gets exactly those episodes.

    A full reset seeds torch's generator with ``seed`` (the draws of a policy that still
    explores); ``between_steps`` is called before every step."""

    def __init__(self, seed: int, between_steps: Callable[[], None] = no_stop) -> None:
        super().__init__()
        self.seed = seed
        self.between_steps = between_steps
        self.playing: torch.Tensor | None = None

    def _reset(
        self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        reset = tensordict.get("_reset", None) if tensordict is not None else None
        if reset is None or reset.all():
            self.playing = torch.ones((*tensordict_reset.batch_size, 1), dtype=torch.bool)
            torch.manual_seed(self.seed)
        return tensordict_reset

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.between_steps()
        return tensordict.set("_step", self.playing.clone())

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self.playing &= ~next_tensordict["done"]
        return next_tensordict


def evaluation_seed(config: Config) -> int:
    return config.seed + EVAL_SEED_OFFSET


def episode_starts(
    config: Config, seed: int, episodes: int, abandon_point: Callable[[], None] = no_stop
) -> list[dict[str, Any]]:
    """The random state each of the first ``episodes`` evaluation episodes starts from.

    Episode k is the k-th that one env seeded ``seed`` plays one after another, after a
    first reset never played (a collector's, when built): the order of the evaluations
    made before they were batched, whose scores then still compare. A reset draws an
    episode's start from the env's generator and steps draw nothing from it, so replaying
    the resets alone gives each episode's start."""
    env = make_env(dataclasses.replace(config.env, num_envs=1), seed)
    gym_env = gymnasium_env(env)
    env.reset()
    starts = []
    try:
        for _ in range(episodes):
            abandon_point()
            env.reset()
            starts.append(gym_env.random_state_before_reset)
    finally:
        env.close()
    return starts


def episode_env(
    config: Config,
    seed: int,
    index: int,
    start: dict[str, Any],
    render_mode: str | None = None,
    abandon_point: Callable[[], None] = no_stop,
) -> EnvBase:
    """An env whose next episode is evaluation episode ``index``, starting from ``start``
    (:func:`episode_starts`). It is seeded ``seed + index``: an Atari emulator, which draws
    its sticky actions from its own generator at every step, then plays each episode with
    a generator of its own. ``abandon_point`` is called first (a batch of 100 Atari envs
    takes seconds to build)."""
    abandon_point()
    env = make_env(
        dataclasses.replace(config.env, num_envs=1),
        seed + index,
        render_mode=render_mode,
        network=config.network,
    )
    env.append_transform(StartsFrom(gymnasium_env(env), start))
    return env


class StartsFrom(Transform):
    """Every reset of the env draws its episode from the random state ``start``: an
    evaluator resets its env more than once before the first step (its collector when
    built, then each evaluation)."""

    def __init__(self, gym_env: gym.Env, start: dict[str, Any]) -> None:
        super().__init__()
        self.gym_env = gym_env
        self.start = start

    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase | None:
        self.gym_env.unwrapped.np_random.bit_generator.state = self.start
        return tensordict


def evaluation_env(
    config: Config, seed: int | None = None, render_mode: str | None = None
) -> EnvBase:
    """An env whose next episode is the evaluation's first (with ``seed``, that of an
    evaluation seeded so), for replaying it without a batch, e.g. to film it."""
    seed = evaluation_seed(config) if seed is None else seed
    return episode_env(config, seed, 0, episode_starts(config, seed, 1)[0], render_mode)
