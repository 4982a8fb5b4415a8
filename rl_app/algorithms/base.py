"""The small interface between the training loop and an RL algorithm.

No core module imports an algorithm module: ``rl_app.run`` builds one with
:func:`rl_app.algorithms.make_algorithm`, and the loop calls only the methods below. Adding
an algorithm (TD3 came in this way) means:

1. one module, ``rl_app/algorithms/<name>.py``, with a class implementing :class:`Algorithm`
   that declares ``actions`` (``"continuous"`` or ``"discrete"``), ``recurrent`` and
   ``goals`` if it supports them, ``settings`` (its settings class), its acting policy in
   ``make_policy``, an ``__init__`` that calls :meth:`Algorithm.__init__` (which makes the
   policy) and builds the loss, and its ``update`` in one function, whose gradient steps
   :func:`accelerate` makes fast (SAC's whole update; DQN's step; TD3's critic and actor
   steps, each alone);
2. its settings class in ``rl_app/config/algorithms.py`` and its field of ``RunConfig``
   (the config's ``<name>`` group);
3. one line in ``ALGORITHMS`` (``rl_app/algorithms/__init__.py``): its name there is its
   ``algo=`` value;
4. one preset in ``configs/``, and its tests.

The loop, replay and collection need no edit: the ``algo`` choices and the checks that the
env's actions, recurrence and goals fit the algorithm come from the declarations.
"""

from __future__ import annotations

import abc
import functools
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase
from tensordict.nn import CudaGraphModule, TensorDictModuleBase
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.modules import EGreedyModule
from torchrl.objectives import LossModule, ValueEstimators

from rl_app.config import Config, OptimConfig, ReplayConfig
from rl_app.envs import LIFE_LOST, PIXELS_KEY
from rl_app.replay.keys import LOSS_MASK_KEY, NEXT_ACHIEVED_GOAL
from rl_app.upstream.tensordict import without_tensorclass_memo_guards
from rl_app.upstream.torch import EAGER_SPLIT

# optim.target -> TorchRL's estimator. Over a [slices, slice_len] batch TD1 sums the
# discounted rewards up to the slice end and bootstraps there: an n-step return with n the
# steps left in the slice. An n-step transition (rl_app.replay.nstep) carries its summed
# rewards, and TD0 bootstraps it with gamma to the power of its steps_to_next_obs.
VALUE_ESTIMATORS = {
    "td0": ValueEstimators.TD0,
    "nstep": ValueEstimators.TD1,
    "td_lambda": ValueEstimators.TDLambda,
    "nstep_transition": ValueEstimators.TD0,
}


class Algorithm(abc.ABC):
    """What the training loop needs from an algorithm, and what the config checks of it."""

    #: The actions it takes, ``"continuous"`` or ``"discrete"``: the env's must match.
    actions: ClassVar[str]
    #: Its own settings, a dataclass of :func:`rl_app.config.setting` fields, under its
    #: ``algo=`` name in the config (None: it has none).
    settings: ClassVar[type | None] = None
    #: Whether it has a recurrent network (``network.recurrent``).
    recurrent: ClassVar[bool] = False
    #: Whether its MLPs read a goal env's desired goal (``replay.her_ratio``).
    goals: ClassVar[bool] = False

    @staticmethod
    @abc.abstractmethod
    def make_policy(
        config: Config,
        observation_dim: int | None,
        goal_dim: int | None,
        action_spec: TensorSpec,
    ) -> TensorDictModuleBase:
        """The acting policy with fresh weights, from the config, the observation's size
        (None: stacked frames), the desired goal's size (None: no goal) and the action
        spec: all that playing a run needs."""

    @classmethod
    def check(cls, config: Config) -> None:
        """Raise :class:`~rl_app.config.ConfigError` where its own settings group does not fit
        the rest of the config (its declared values are checked already), whichever ``algo``
        runs: none by default."""
        return

    #: The policy that acts in the environment while collecting (it explores).
    policy: TensorDictModuleBase
    #: The TorchRL loss the update minimises.
    loss: LossModule
    #: The optimizer of every trained parameter (the loop anneals its learning rate).
    optimizer: torch.optim.Optimizer
    #: The learner's device: where every tensor an update reads lives.
    device: torch.device
    #: The TorchRL exploration module of ``policy`` whose schedule the loop advances by the
    #: frames collected (``step(frames)``: DQN's annealed epsilon); None where the policy
    #: explores by itself.
    exploration: EGreedyModule | None = None
    #: Whether sampled goals are relabelled in hindsight (``replay.her_ratio``).
    relabels_goals: bool = False
    #: Whether its n-step transitions end at a lost life (``env.life_loss_terminal``).
    ends_at_lost_lives: bool = False

    def replay_keys(self) -> list[Any]:
        """What an update reads from a transition (the loss's ``in_keys``), where the
        relabelling goals come from when ``relabels_goals``, and which steps lost a life when
        ``ends_at_lost_lives``: with the trajectory ids, all the replay buffer stores of a
        collected frame."""
        keys = list(self.loss.in_keys)
        if self.relabels_goals:
            keys.append(NEXT_ACHIEVED_GOAL)
        if self.ends_at_lost_lives:
            keys.append(("next", LIFE_LOST))
        return keys

    def __init__(self, config: Config, env: EnvBase, device: torch.device) -> None:
        """What every algorithm keeps of the config and the env: what :meth:`make_policy`
        reads, and the acting policy on ``device``. An algorithm's own ``__init__`` calls
        this first, then builds its networks and loss."""
        self._config = config
        self._observation_dim = observation_dim(env)
        self._goal_dim = goal_dim(env)
        self._action_spec = env.action_spec_unbatched.clone().cpu()
        self.device = device
        self.relabels_goals = config.replay.her_ratio > 0
        self.policy = self.policy_factory()().to(device)

    def policy_factory(self) -> Callable[..., TensorDictModuleBase]:
        """A picklable factory for a fresh copy of ``policy``, for evaluation and for
        collector worker processes. Weights are loaded into the copy separately."""
        return functools.partial(
            self.make_policy, self._config, self._observation_dim, self._goal_dim, self._action_spec
        )

    def check_device(self, batch: TensorDictBase) -> None:
        """Raise :class:`LearnerDeviceError` naming each tensor an update on ``batch`` would
        read that is not on the learner's device: the batch's, the loss's (networks, target
        networks, value estimator) and the optimizer's state."""
        check_learner_device(self.device, batch, {"loss": self.loss}, self.optimizer)

    @abc.abstractmethod
    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One gradient step on a sampled batch: ``[batch_size]`` transitions, or
        ``[slices, slice_len]`` steps (time last, in time order) from a slice sampler.

        Returns the detached scalar metrics of the step (losses, temperature, ...) and,
        under ``PRIORITY_KEY`` (:mod:`rl_app.replay`), the TD error of each step of
        ``batch``, which the loop writes back as new priorities. Its gradient steps go
        through :func:`accelerate` (``optim.compile``, ``optim.cudagraphs``)."""

    def recurrent_states(self, sequences: TensorDictBase) -> TensorDictBase | None:
        """The recurrent state each record of the sampled ``[sequences, steps]`` would act
        with under the current weights (``RECURRENT_STATE_KEYS`` of :mod:`rl_app.envs`,
        and the state after it under ``"next"``), unrolled from each sequence's first
        stored state: what refreshes the stored states. None: no recurrent network."""
        return None

    @abc.abstractmethod
    def checkpoint_components(self) -> dict[str, Any]:
        """Everything of the algorithm a resume needs (networks, target networks,
        optimizer, exploration state), each object offering ``state_dict``."""


def make_value_estimator(loss: LossModule, optim: OptimConfig, device: torch.device) -> None:
    """Give ``loss`` the value target ``optim.target`` names, its tensors (gamma, lambda) on
    the learner's ``device``: made after the loss was moved there, they would stay on the
    CPU, which a CUDA graph cannot read.

    Every estimator bootstraps through ``("next", "terminated")`` only: a ``done`` without
    termination (a time limit, or the end of a sampled slice) cuts a multi-step chain and
    bootstraps from the next state's value; it never ends the return."""
    hyperparams: dict[str, Any] = {"gamma": optim.gamma, "device": device}
    if optim.target == "td_lambda":
        hyperparams["lmbda"] = optim.lmbda
    loss.make_value_estimator(VALUE_ESTIMATORS[optim.target], **hyperparams)


def mask_padded_steps(loss: LossModule, replay: ReplayConfig, stacked_frames: bool = False) -> None:
    """With TorchRL's Sequence windows (``replay.sampler=prioritized_sequence``) the loss
    counts only the steps under ``LOSS_MASK_KEY``: learning steps of the sampled episode,
    neither burn-in steps nor the padding past an episode end (:mod:`rl_app.replay.sequences`); with
    ``stacked_frames``, only the steps whose stacks were rebuilt whole
    (:mod:`rl_app.replay.frames`)."""
    if replay.sampler == "prioritized_sequence" or stacked_frames:
        loss.loss_mask_key = LOSS_MASK_KEY


def observation_dim(env: EnvBase) -> int | None:
    """The size of ``env``'s flat observation, or None where it observes stacked frames."""
    if PIXELS_KEY in env.observation_spec.keys():
        return None
    return env.observation_spec["observation"].shape[-1]


def goal_dim(env: EnvBase) -> int | None:
    """The size of the desired goal ``env`` observes (a goal env), or None."""
    if "desired_goal" not in env.observation_spec.keys():
        return None
    return env.observation_spec["desired_goal"].shape[-1]


def network_inputs(observation_dim: int, goal_dim: int | None) -> tuple[list[str], int]:
    """What a network over a flat observation reads, and their total size: the observation,
    then a goal env's desired goal (``goal_dim``, None: no goal). TorchRL's MLP concatenates
    its inputs in this order, so one network conditions on the goal."""
    if goal_dim is None:
        return ["observation"], observation_dim
    return ["observation", "desired_goal"], observation_dim + goal_dim


def make_adam(parameters: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Adam:
    """Adam at ``optim.lr`` with epsilon ``optim.adam_eps``, fused into one kernel per step
    with ``optim.fused_adam``, and keeping its step counts on the GPU (capturable) when a
    CUDA graph replays the update."""
    return torch.optim.Adam(
        parameters,
        lr=optim.lr,
        eps=optim.adam_eps,
        fused=optim.fused_adam,
        capturable=optim.cudagraphs,
    )


# Eager steps before the capture: the compiled loss compiles there, and the optimizer
# creates its state, which the graph then updates in place.
CUDA_GRAPH_WARMUP = 10


class LearnerDeviceError(RuntimeError):
    """An update would read a tensor that is not on the learner's device."""


def tensors_elsewhere(
    device: torch.device,
    batch: TensorDictBase,
    modules: Mapping[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
) -> list[str]:
    """Every tensor an update reads that is not on ``device``, named with its device: the
    batch's, the parameters and buffers of ``modules`` (by their names there), and the
    optimizer's state (by parameter, in the order of its groups)."""

    def elsewhere(tensor: torch.Tensor) -> bool:
        return tensor.device.type != device.type or (
            device.index is not None and tensor.device.index != device.index
        )

    found = [
        f"batch[{key!r}] ({tensor.device})"
        for key, tensor in batch.items(include_nested=True, leaves_only=True)
        if elsewhere(tensor)
    ]
    for owner, module in modules.items():
        for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
            if elsewhere(tensor):
                found.append(f"{owner}.{name} ({tensor.device})")
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    for index, parameter in enumerate(parameters):
        for name, value in optimizer.state.get(parameter, {}).items():
            if isinstance(value, torch.Tensor) and elsewhere(value):
                found.append(f"optimizer state {name!r} of parameter {index} ({value.device})")
    return found


def check_learner_device(
    device: torch.device,
    batch: TensorDictBase,
    modules: Mapping[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
) -> None:
    """Raise :class:`LearnerDeviceError` naming every tensor of :func:`tensors_elsewhere`:
    CUDA's own error at a capture names none."""
    if found := tensors_elsewhere(device, batch, modules, optimizer):
        raise LearnerDeviceError(
            f"the update reads tensors that are not on the learner's device {device}: "
            + ", ".join(found)
        )


def accelerate(
    update: Callable[[TensorDictBase], TensorDictBase],
    optim: OptimConfig,
    check: Callable[[TensorDictBase], None],
    *losses: torch.nn.Module,
) -> Callable[[TensorDictBase], TensorDictBase]:
    """``update`` as fast as ``optim`` asks: the one place compile and CUDA graphs are put
    around an algorithm's update.

    ``optim.compile``: each module of ``losses`` is compiled in place (calling it runs one
    graph for its forward and one for its backward), which removes the Python and
    TensorDict overhead around its tensor work. The first update pays the compile; torch's
    on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) spares later runs most of it.

    ``optim.cudagraphs``: ``update`` is recorded once as a CUDA graph that later updates
    replay with new batches of the same shape, in one launch. Before each warm-up step and
    before the capture, ``check(batch)`` makes sure that everything the step reads is on the
    learner's device (the optimizer makes its state in the first step). Without CUDA,
    tensordict's ``CudaGraphModule`` calls ``update`` unchanged (the configuration refuses
    ``optim.cudagraphs`` on a machine without CUDA)."""
    if optim.compile:
        # fallback_random: draw random numbers as eager code does, so that a compiled
        # update takes the same step as an uncompiled one and a run may switch on resume.
        # EAGER_SPLIT: save what eager autograd saves for the backward (faster:
        # docs/speed.md); the guard filter spares a recompile after the first evaluation
        # (both: rl_app.upstream).
        options = {"fallback_random": True, "guard_filter_fn": without_tensorclass_memo_guards}
        for loss in losses:
            loss.compile(options={**options, **EAGER_SPLIT})
    if not optim.cudagraphs:
        return update
    # in_keys=[]: the update takes a whole TensorDict and returns one.
    graph = CudaGraphModule(update, warmup=CUDA_GRAPH_WARMUP, in_keys=[], out_keys=[])
    checks_left = CUDA_GRAPH_WARMUP + 1

    def checked_update(batch: TensorDictBase) -> TensorDictBase:
        nonlocal checks_left
        if checks_left:
            check(batch)
            checks_left -= 1
        return graph(batch)

    return checked_update
