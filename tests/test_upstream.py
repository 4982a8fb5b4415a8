"""The dependencies' behaviours that rl_app/upstream/ works around (TorchRL 0.14.1, torch
2.14.1, tensordict 0.14.3, Optuna 5.0.0, glibc's malloc, pytest 9.2.0 with pytest-xdist
3.8.0), checked on the installed versions. A failure here after an upgrade means one of
them changed (or fixed) that behaviour: revisit the workaround named in the test, and drop
it where it is no longer needed."""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import optuna
import pytest
import torch
import torchrl
from gymnasium.wrappers import TimeLimit
from tensordict import TensorDict
from tensordict import utils as tensordict_utils
from tensordict.nn import TensorDictModule, TensorDictParams, TensorDictSequential
from torch.utils.flop_counter import FlopCounterMode
from torchrl.checkpoint import Checkpoint, CheckpointRotation
from torchrl.collectors import Collector
from torchrl.collectors.distributed import DistributedCollector
from torchrl.collectors.distributed import generic as torchrl_distributed
from torchrl.data import (
    HERReplayBuffer,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.envs import EnvBase, SerialEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.modules import LSTMModule, set_recurrent_mode
from torchrl.weight_update import MultiProcessWeightSyncScheme
from xdist.remote import WorkerInteractor

from rl_app.algorithms import make_algorithm
from rl_app.checks import load_config
from rl_app.config import SEGMENT_TREE_MAX_SIZE, EnvConfig, ReplayConfig
from rl_app.envs import env_factory, make_env
from rl_app.envs.resumable import ResumableEnv
from rl_app.replay import make_sampler
from rl_app.replay.hindsight import HindsightReplayBuffer
from rl_app.upstream.gymnasium import set_elapsed_steps
from rl_app.upstream.optuna import resumed_trial
from rl_app.upstream.pytest import send_to_group
from rl_app.upstream.tensordict import (
    INLINE_MODULES_WARNING,
    TENSORCLASS_MEMO,
    without_tensorclass_memo_guards,
)
from rl_app.upstream.torch import CPP_EXTENSION_LOGGER, EAGER_SPLIT, MatmulFlops
from rl_app.upstream.torchrl import (
    GENERATION_BYTES,
    TREE_LEAF_BYTES,
    TREE_VALUE_BYTES,
    SliceStartIndex,
    VectorizedSliceSampler,
    add_checkpoint_metadata,
    close_keeping_threads,
    gymnasium_env,
    lay_out_storage,
    load_sampler_state,
    next_step_input,
    replay_generator,
    sampler_state,
    set_storage_length,
)
from rl_app.upstream.torchrl_collectors import undo_trajectory_id_shifts
from rl_app.upstream.torchrl_sequences import unrolling_view
from rl_app.upstream.torchrl_workers import GuardedWeightSyncScheme
from tests import faulty_envs
from tests.helpers import PYTHON, ROOT
from tests.test_her_upstream import SLICE_LEN, UNREACHED, episode, slice_sampler


def test_gym_wrapper_keeps_the_gymnasium_env_in_a_private_attribute() -> None:
    env = make_env(EnvConfig(), seed=0)
    assert isinstance(gymnasium_env(env), ResumableEnv)


def test_a_collector_still_carries_the_next_step_in_a_private_attribute() -> None:
    env = make_env(EnvConfig(), seed=0)
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=5, total_frames=-1)
    batch = next(iter(collector))
    carried = next_step_input(collector)
    assert torch.equal(carried["observation"], batch["next", "observation"][-1])
    assert int(carried["step_count"]) == 5
    # Its own checkpoint state leaves the episode out: a load starts a new trajectory.
    collector.load_state_dict(collector.state_dict(), strict=False)
    assert int(next_step_input(collector)["collector", "traj_ids"]) == 1
    collector.shutdown()


def test_time_limit_still_counts_steps_in_a_private_attribute() -> None:
    env = TimeLimit(gym.make("Pendulum-v1"), max_episode_steps=3)
    env.reset(seed=0)
    set_elapsed_steps(env, 2)
    assert env.step(env.action_space.sample())[3]  # truncated: the count went on from 2


def test_weight_sync_receiver_steps_are_still_private_hooks() -> None:
    # GuardedWeightSyncScheme overrides these with the same signatures...
    for name in (
        "_wait_for_instruction",
        "_send_ack",
        "_wait_for_ack",
        "_setup_connection_and_weights_on_receiver_impl",
    ):
        ours = inspect.signature(getattr(GuardedWeightSyncScheme, name))
        theirs = inspect.signature(getattr(MultiProcessWeightSyncScheme, name))
        assert list(ours.parameters) == list(theirs.parameters), name
    # ...and TorchRL's background receiver still takes its steps through them.
    loop = inspect.getsource(MultiProcessWeightSyncScheme._background_receive_loop)
    assert "self._wait_for_instruction()" in loop
    assert "self._send_ack(" in loop


def test_weight_sync_still_gives_workers_on_one_device_one_copy_of_the_weights() -> None:
    # GuardedWeightSyncScheme gives each worker its own copy when it connects.
    first_weights = TensorDict({"weight": torch.zeros(3)}, [])
    cpu = torch.device("cpu")
    per_worker = MultiProcessWeightSyncScheme()._get_params_map(
        weights=first_weights, devices=[cpu, cpu]
    )
    assert per_worker[0]["weight"].data_ptr() == per_worker[1]["weight"].data_ptr()
    connect = inspect.getsource(
        MultiProcessWeightSyncScheme._setup_connection_and_weights_on_receiver_impl
    )
    assert "inplace=False" in connect


def test_weight_sync_still_waits_for_acks_without_a_limit() -> None:
    wait = inspect.signature(MultiProcessWeightSyncScheme._wait_for_ack)
    assert wait.parameters["timeout"].default is None


def test_distributed_collector_still_takes_its_join_wait_in_days() -> None:
    assert torchrl_distributed.MAX_TIME_TO_CONNECT == 1000
    assert "timedelta(MAX_TIME_TO_CONNECT)" in inspect.getsource(
        DistributedCollector._init_master_dist
    )
    hooks = ("_init_workers", "_init_worker_dist_submitit", "_init_master_dist")
    assert all(callable(getattr(DistributedCollector, name, None)) for name in hooks)


def test_distributed_collector_still_stops_at_once_when_frames_are_minus_one() -> None:
    # An endless collector (total_frames=-1) yields nothing: UNBOUNDED_FRAMES stands in.
    source = inspect.getsource(DistributedCollector._iterator_dist)
    assert "while total_frames < self.total_frames" in source


def test_distributed_collectors_still_split_the_warm_up() -> None:
    from torchrl.collectors.distributed import RPCCollector

    from rl_app.upstream.torchrl_collectors import split_warm_up

    for collector in (DistributedCollector, RPCCollector):
        assert "init_random_frames // self.num_workers" in inspect.getsource(collector.__init__)
    # 401 frames among 2 workers: shares of 201, not TorchRL's 200 of 401 // 2.
    assert split_warm_up(401, 2) // 2 == 201
    assert split_warm_up(400, 2) == 400


def test_distributed_collector_still_shifts_ids() -> None:
    assert "traj_ids[i] += traj_ids[i - 1].max()" in inspect.getsource(
        DistributedCollector._next_sync
    )
    local = torch.tensor([[1, 1, 2, 2], [0, 0, 0, 1], [5, 6, 6, 6]])
    shifted = local.clone()
    for job in range(1, 3):  # what _next_sync does
        shifted[job] += shifted[job - 1].max()
    assert torch.equal(undo_trajectory_id_shifts(shifted), local)


def test_distributed_shutdown_still_closes_the_weight_store_itself() -> None:
    assert "_weight_sync_schemes" in inspect.getsource(DistributedCollector.shutdown)


def test_async_collector_names_a_dead_worker_or_fails_to_close_another() -> None:
    # In 0.14.1 TorchRL notices a dead worker at its next batch (earlier versions went on
    # with the others); rl_app checks before each push and checkpoint all the same. It then
    # terminates the other workers and closes them 0.1 s later: one still exiting makes it
    # raise a ValueError instead, which rl_app.collection.naming_dead_workers names.
    env = EnvConfig(name=f"tests.faulty_envs:{faulty_envs.RAISES_AT_1100}")
    spec_env = make_env(env, seed=0)
    collector = Collector(
        [env_factory(env, seed) for seed in (0, 1)],
        RandomPolicy(spec_env.action_spec),
        num_collectors=2,
        sync=False,
        frames_per_batch=200,
        total_frames=-1,
    )
    try:
        failed = r"process failed: worker \d|Cannot close a process while it is still running"
        with pytest.raises((RuntimeError, ValueError), match=failed):
            for _ in collector:
                pass
    finally:
        collector.shutdown()


def serial_pendulums() -> SerialEnv:
    return SerialEnv(3, functools.partial(make_env, EnvConfig(name="Pendulum-v1"), 0))


def test_closing_a_serial_env_still_raises_the_thread_count() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = serial_pendulums()
        env.reset()
        env.close()
        # TorchRL's close: min(the count when torchrl was imported, now + 3 workers).
        assert torch.get_num_threads() == min(torchrl._THREAD_POOL_INIT, 4)
        torch.set_num_threads(1)
        env = serial_pendulums()
        env.reset()
        close_keeping_threads(env)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


class Stopped(Exception):
    """What a stop raises in the middle of building a batch of envs."""


def pendulum_or_stop(index: int, stop_at: int, built: list[int]) -> EnvBase:
    built.append(index)
    if len(built) == stop_at:
        raise Stopped
    return make_env(EnvConfig(name="Pendulum-v1"), index)


def test_a_batch_whose_envs_failed_to_start_still_refuses_to_close() -> None:
    # SerialEnv builds one env for its specs, then each of its own at the first reset:
    # the third build (the second of its own) is stopped.
    for close in (lambda env: env.close(), close_keeping_threads):
        built: list[int] = []
        env = SerialEnv(
            2,
            functools.partial(pendulum_or_stop, stop_at=3, built=built),
            create_env_kwargs=[{"index": 0}, {"index": 1}],
        )
        with pytest.raises(Stopped if close is close_keeping_threads else RuntimeError) as error:
            try:
                env.reset()
            finally:
                close(env)
        if close is not close_keeping_threads:  # TorchRL's close masks the stop
            assert "trying to close a closed environment" in str(error.value)


def test_an_unrolled_lstm_still_writes_zeros_before_the_last_step() -> None:
    lstm = LSTMModule(
        input_size=3,
        hidden_size=4,
        in_keys=["x", "h", "c"],
        out_keys=["y", ("next", "h"), ("next", "c")],
    )
    steps = TensorDict(
        {
            "x": torch.randn(2, 5, 3),
            "h": torch.randn(2, 5, 1, 4),
            "c": torch.randn(2, 5, 1, 4),
            "is_init": torch.zeros(2, 5, 1, dtype=torch.bool),
        },
        [2, 5],
    )
    with set_recurrent_mode(True):
        out = lstm(steps.clone())
    assert (out["next", "h"][:, :-1] == 0).all() and (out["next", "h"][:, -1] != 0).any()
    # The view keeps the stored next states and gives the same outputs.
    with set_recurrent_mode(True):
        viewed = unrolling_view(TensorDictSequential(lstm))(steps.clone())
    assert "next" not in viewed.keys() and torch.equal(viewed["y"], out["y"])


# inductor's options for each way of compiling the loss; None: the eager loss.
LOSS_COMPILES: dict[str, dict[str, Any] | None] = {
    "eager": None,
    "inductor's split": {},
    "eager split": EAGER_SPLIT,
    "eager split, in-place buffers on": {**EAGER_SPLIT, "inplace_buffers": True},
}


@functools.cache
def sac_backward(compiled: str) -> tuple[set[torch.dtype], list[torch.Tensor]]:
    """One backward pass of a small SAC loss on a Pendulum rollout, compiled as
    ``LOSS_COMPILES[compiled]`` says: the dtypes the loss saved for its backward, and the
    gradient of every parameter."""
    # The loss of a compiled run (vmapped Q-nets), left uncompiled by the algorithm: the test
    # compiles it.
    overrides = [
        "network.hidden_sizes=[32,32]",
        "optim.batch_size=64",
        "optim.compile=false",
        "sac.vmap_qnets=true",
    ]
    config = load_config("default", overrides)
    env = make_env(config.env, seed=0)
    torch.manual_seed(0)
    algorithm = make_algorithm(config, env, torch.device("cpu"))
    batch = env.rollout(64, break_when_any_done=False).select(*algorithm.replay_keys())
    options = LOSS_COMPILES[compiled]
    loss = algorithm.loss
    if options is not None:
        # Dynamo stops compiling a function after 8 compiles in a process, then runs it
        # eagerly: start from none.
        torch.compiler.reset()
        loss = torch.compile(loss, options={"fallback_random": True, **options})
    saved: set[torch.dtype] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.add(tensor.dtype)
        return tensor

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        losses = loss(batch)
    (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
    return saved, [parameter.grad for parameter in algorithm.loss.parameters()]


def same_gradients(compiled: str) -> bool:
    pairs = zip(sac_backward("eager")[1], sac_backward(compiled)[1], strict=True)
    return all(a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)


def test_inductor_still_saves_bool_masks_for_relu_backward() -> None:
    assert torch.bool in sac_backward("inductor's split")[0]
    assert torch.bool not in sac_backward("eager split")[0]
    assert same_gradients("inductor's split") and same_gradients("eager split")


def test_the_eager_split_still_needs_inplace_buffers_off() -> None:
    assert not same_gradients("eager split, in-place buffers on")


def compiles_after_a_new_class(guard_filter: Any) -> int:
    """How many times a compiled TensorDict function compiles over two calls between which
    tensordict's class memo learns a new class."""
    torch.compiler.reset()
    graphs = []

    def backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    options = {} if guard_filter is None else {"guard_filter_fn": guard_filter}
    double = torch.compile(lambda td: td.apply(lambda x: 2 * x), backend=backend, options=options)
    data = TensorDict({"a": torch.ones(3)}, [3])
    double(data)
    tensordict_utils._is_tensorclass(type("NewClass", (), {}))
    double(data)
    return len(graphs)


def test_a_compiled_loss_still_guards_on_tensordicts_class_memo() -> None:
    assert hasattr(tensordict_utils, TENSORCLASS_MEMO)
    assert compiles_after_a_new_class(None) == 2
    assert compiles_after_a_new_class(without_tensorclass_memo_guards) == 1


def test_sac_loss_still_creates_its_target_entropy_buffer_on_first_use() -> None:
    config = load_config("default", ["network.hidden_sizes=[8]", "optim.compile=false"])
    env = make_env(config.env, seed=0)
    loss = make_algorithm(config, env, torch.device("cpu")).loss
    assert "_target_entropy" in dict(loss.named_buffers())  # created by the algorithm
    fresh = type(loss)(loss.actor_network, loss.qvalue_network, action_spec=env.action_spec)
    assert "_target_entropy" not in dict(fresh.named_buffers())
    fresh.target_entropy  # noqa: B018
    assert "_target_entropy" in dict(fresh.named_buffers())


def test_a_lazy_storage_still_lays_itself_out_at_the_first_extend(tmp_path) -> None:
    record = TensorDict({"observation": torch.zeros(3)}, [])
    extended = LazyMemmapStorage(10, scratch_dir=tmp_path / "extended")
    assert not list((tmp_path / "extended").rglob("*.memmap"))
    extended.set(0, record)
    laid_out = LazyMemmapStorage(10, scratch_dir=tmp_path / "laid_out")
    lay_out_storage(laid_out, record)
    for storage in (extended, laid_out):
        (file,) = Path(storage.scratch_dir).rglob("observation.memmap")
        assert file.stat().st_size == 10 * 3 * 4  # every slot, before it is written
    assert len(laid_out) == 0


def test_a_checkpoint_manifest_is_still_read_from_manifest_json(tmp_path) -> None:
    rotation = CheckpointRotation(tmp_path, keep_last=1, keep_best=("score", "max"))
    checkpoint = Checkpoint()
    checkpoint.register("weights", {"w": 1})
    scored = checkpoint.save(tmp_path / "checkpoint-000000000001", metadata={"score": 1.0})
    unscored = checkpoint.save(tmp_path / "checkpoint-000000000002")
    assert rotation.best() == scored
    add_checkpoint_metadata(unscored, {"score": 2.0})
    assert Checkpoint.manifest(unscored)["metadata"] == {"score": 2.0}
    assert rotation.best() == unscored and not list(unscored.glob(".*"))  # nothing staged left
    checkpoint.load(unscored)  # still a checkpoint TorchRL loads


def test_tensordict_still_looks_for_pandas_on_every_module_output(monkeypatch) -> None:
    looked_up = []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: looked_up.append(name) or find_spec(name, *a)
    )
    module = TensorDictModule(torch.nn.Linear(2, 2), in_keys=["x"], out_keys=["y"])
    module(TensorDict({"x": torch.ones(2)}, []))
    assert "pandas" in looked_up


def test_a_replay_buffer_keeps_its_generator_in_a_private_attribute() -> None:
    generator = torch.Generator()
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(4), generator=generator)
    assert replay_generator(buffer) is generator
    assert "_storage" in buffer.state_dict()  # the public state holds the data too


def test_a_storage_length_is_set_through_a_private_attribute(tmp_path) -> None:
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    storage.set(torch.arange(6), TensorDict({"x": torch.arange(6.0)}, [6]))
    set_storage_length(storage, 4)
    assert len(storage) == 4 and storage.get(slice(0, len(storage)))["x"].tolist() == [0, 1, 2, 3]


def test_a_prioritized_sampler_state_holds_extension_objects() -> None:
    def sampler() -> PrioritizedSliceSampler:
        return PrioritizedSliceSampler(100, alpha=0.6, beta=0.4, slice_len=4, traj_key="t")

    saved = sampler()
    saved.update_priority(torch.arange(0, 100, 3), torch.linspace(0.1, 9, 34))
    assert not isinstance(saved.state_dict()["_sum_tree"], torch.Tensor)
    loaded = sampler()
    load_sampler_state(loaded, sampler_state(saved))
    for key in ("_sum_tree", "_min_tree"):
        before, after = saved.state_dict()[key], loaded.state_dict()[key]
        assert all(before.query(0, end) == after.query(0, end) for end in range(1, 101))


def test_the_prioritized_slice_sampler_still_pads_in_a_loop() -> None:
    assert "for pad_row" in inspect.getsource(PrioritizedSliceSampler._padded_indices)
    lengths = torch.tensor([3, 1, 5, 2, 5]).reshape(-1, 1)  # as TorchRL passes them
    arange = torch.arange(100, 116)
    sampler = VectorizedSliceSampler(10, alpha=0.6, beta=0.4, slice_len=2, traj_key="t")
    expected = PrioritizedSliceSampler._padded_indices(sampler, lengths, arange)
    assert torch.equal(sampler._padded_indices(lengths, arange), expected)


class SliceStream:
    """Random writes into prioritized slice buffers of random capacity and slice length:
    trajectories of random lengths (one step included) whose ids go on across extends,
    random done flags, extends from one step to more than the capacity (the ring wraps,
    fills, is overwritten whole), random priority updates. Every buffer gets the same."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.capacity, self.slice_len = self.rng.randint(5, 60), self.rng.randint(2, 5)
        self.new_trajectory = self.rng.choice([0.05, 0.2, 0.5])
        self.trajectory = self.written = 0

    def buffer(
        self, sampler: PrioritizedSliceSampler, seed: int, storage: type = LazyTensorStorage
    ) -> TensorDictReplayBuffer:
        generator = torch.Generator()
        generator.manual_seed(seed)
        return TensorDictReplayBuffer(
            storage=storage(self.capacity),
            sampler=sampler,
            writer=TensorDictRoundRobinWriter(),
            priority_key="priority",
            generator=generator,
        )

    def sampler(self, kind: type, keys: dict[str, Any], cache: bool) -> PrioritizedSliceSampler:
        return kind(self.capacity, alpha=0.7, beta=0.5, slice_len=self.slice_len,
                    cache_values=cache, **keys)  # fmt: skip

    def batch(self, first: bool) -> TensorDict:
        # TorchRL cannot sample a storage of one step by done flags (it squeezes it to 0-d).
        largest = self.capacity + 3 if self.rng.random() < 0.1 else max(2, self.capacity // 3)
        steps = self.rng.randint(2 if first else 1, largest)
        ids, dones = [], []
        for _ in range(steps):
            self.trajectory += self.rng.random() < self.new_trajectory
            ids.append(self.trajectory)
            dones.append(self.rng.random() < 0.15)
        done = torch.tensor(dones).unsqueeze(-1)
        self.written += steps
        return TensorDict(
            {
                "trajectory": torch.tensor(ids),
                "step": torch.arange(self.written - steps, self.written),
                ("next", "done"): done,
                ("next", "terminated"): done & (torch.tensor(ids) % 2 == 0).unsqueeze(-1),
            },
            [steps],
        )

    def priorities(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        count = self.rng.randint(1, 10)
        index = torch.tensor([self.rng.randrange(length) for _ in range(count)])
        return index, torch.tensor([self.rng.uniform(0.0, 5.0) for _ in range(count)])


def sampled(buffer: TensorDictReplayBuffer, batch_size: int) -> TensorDict | str:
    """A sample of ``batch_size``, or the error sampling raised."""
    try:
        return buffer.sample(batch_size)
    except Exception as error:  # the samplers must fail alike
        return repr(error)


def assert_same_samples(buffers: list[TensorDictReplayBuffer], stream: SliceStream) -> int | None:
    """Extend ``buffers`` alike from ``stream``, sample each after every extend and compare
    everything sampled (records, index, weights, flags); the samples compared, or None where
    sampling failed (alike) and comparing stopped."""
    compared = 0
    for extend in range(stream.rng.randint(5, 40)):
        batch = stream.batch(first=extend == 0)
        for buffer in buffers:
            buffer.extend(batch.clone())
        if stream.rng.random() < 0.5:
            index, priority = stream.priorities(len(buffers[0]))
            for buffer in buffers:
                buffer.update_priority(index, priority)
        for _ in range(stream.rng.randint(0, 3)):
            batch_size = stream.slice_len * stream.rng.randint(1, 6)
            samples = [sampled(buffer, batch_size) for buffer in buffers]
            expected, *others = samples
            for sample in others:
                if isinstance(expected, str):
                    assert sample == expected
                else:
                    assert set(sample.keys(True, True)) == set(expected.keys(True, True))
                    for key in expected.keys(True, True):
                        assert torch.equal(sample[key], expected[key]), key
            if isinstance(expected, str):
                return None  # TorchRL leaves the masked slots' priorities at 0 after this
            compared += 1
    return compared


@pytest.mark.parametrize("ends", ["trajectory ids", "done flags"])
def test_the_vectorized_slice_sampler_samples_as_torchrl_does(monkeypatch, ends: str) -> None:
    keys = {"traj_key": "trajectory"} if ends == "trajectory ids" else {"end_key": ("next", "done")}
    built, updated = [], []
    monkeypatch.setattr(SliceStartIndex, "__init__", spy(SliceStartIndex.__init__, built))
    monkeypatch.setattr(SliceStartIndex, "written", spy(SliceStartIndex.written, updated))
    compared = 0
    for seed in range(100):
        stream = SliceStream(seed)
        samplers = [stream.sampler(PrioritizedSliceSampler, keys, cache=False),
                    stream.sampler(VectorizedSliceSampler, keys, cache=True)]  # fmt: skip
        compared += assert_same_samples([stream.buffer(s, seed) for s in samplers], stream) or 0
    assert compared > 1000
    # Most extends updated the starts; the rest (extends past the capacity) built them again.
    assert sum(updated) > 10 * (len(built) - 100), (len(built), sum(updated))


def spy(method: Callable, calls: list) -> Callable:
    def spied(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        calls.append(True if result is None else result)
        return result

    return spied


def test_the_slice_starts_are_built_again_after_a_load_or_a_write_past_the_sampler() -> None:
    keys = {"traj_key": "trajectory"}
    for seed in range(20):
        stream = SliceStream(seed)
        torchrl, rl_app = (
            stream.buffer(stream.sampler(kind, keys, cache), seed, LazyMemmapStorage)
            for kind, cache in ((PrioritizedSliceSampler, False), (VectorizedSliceSampler, True))
        )
        if assert_same_samples([torchrl, rl_app], stream) is None:
            continue
        # A resumed run's sampler: a new one, its state loaded, on the storage as it was.
        resumed = stream.sampler(VectorizedSliceSampler, keys, cache=True)
        load_sampler_state(resumed, sampler_state(rl_app.sampler))
        rl_app.set_sampler(resumed)
        rl_app.set_rng(replay_generator(rl_app))
        # A write past the sampler: new trajectory ids in place, as a checkpoint load's
        # journal writes the storage.
        slots = torch.arange(0, len(rl_app), 3)
        for buffer in (torchrl, rl_app):
            patch = buffer.storage.get(slots).clone()
            patch["trajectory"] = slots // 6 + 10_000
            buffer.storage.set(slots, patch, set_cursor=False)
        assert_same_samples([torchrl, rl_app], stream)


def test_the_prioritized_slice_sampler_still_recomputes_its_starts_after_every_extend() -> None:
    # TorchRL keeps the slots that may not start a slice in a cache that extend clears;
    # the next sample recomputes them over the whole storage. SliceStartIndex keeps the
    # same slots per write.
    stream = SliceStream(seed=3)
    keys = {"traj_key": "trajectory"}
    sampler = stream.sampler(PrioritizedSliceSampler, keys, cache=True)
    buffer = stream.buffer(sampler, seed=0)
    for first in (True, *[False] * 10):  # the ring fills and wraps
        buffer.extend(stream.batch(first))
        assert "preceding_stop_idx" not in sampler._cache
        buffer.sample(stream.slice_len)
        torchrl = sampler._cache["preceding_stop_idx"]
        index = SliceStartIndex(buffer.storage, "trajectory", True, stream.slice_len)
        assert sorted(torchrl.tolist()) == index.blocked.tolist()
    assert len(buffer) == stream.capacity


class CountingStorage(LazyTensorStorage):
    """A storage counting the reads of whole records at sampled slots."""

    reads = 0

    def get(self, index: Any) -> Any:
        self.reads += isinstance(index, tuple)  # sampled slots, as a tuple of one tensor
        return super().get(index)


def test_the_prioritized_slice_sampler_still_reads_whole_records_for_done_flags() -> None:
    reads = {}
    for kind in (PrioritizedSliceSampler, VectorizedSliceSampler):
        stream = SliceStream(seed=1)
        buffer = TensorDictReplayBuffer(
            storage=CountingStorage(stream.capacity),
            sampler=stream.sampler(kind, {"traj_key": "trajectory"}, cache=True),
        )
        buffer.extend(stream.batch(first=True))
        buffer.sample(stream.slice_len)
        reads[kind] = buffer.storage.reads
    # TorchRL reads the sampled records once for their done flags, then the buffer again.
    assert reads == {PrioritizedSliceSampler: 2, VectorizedSliceSampler: 1}


def test_a_write_bumps_the_storage_mutation_count_once_and_tells_the_sampler(
    monkeypatch,
) -> None:
    # SliceStartIndex updates itself where exactly one write happened since it was current.
    told = []
    sampler = VectorizedSliceSampler(8, alpha=0.6, beta=0.4, slice_len=2, traj_key="t")
    buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(8), sampler=sampler)
    monkeypatch.setattr(
        sampler, "mark_update", lambda index, *, storage: told.append((index, storage))
    )
    for write in range(3):
        revision = buffer.storage._mutation_revision
        buffer.extend(TensorDict({"t": torch.zeros(5, dtype=torch.int64)}, [5]))
        assert buffer.storage._mutation_revision == revision + 1
        assert told[-1][1] is buffer.storage
        assert told[-1][0].tolist() == [(5 * write + i) % 8 for i in range(5)]
    assert buffer.storage._last_cursor_index == 14 % 8


def reached(td: TensorDict) -> torch.Tensor:
    return td["next", "achieved_goal"] == td["desired_goal"]


def her_buffers(capacity: int, strategy: str) -> dict[str, HERReplayBuffer]:
    """TorchRL's buffer and rl_app's, relabelling every sampled transition."""
    options = {
        "her_ratio": 1.0,
        "strategy": strategy,
        "achieved_goal_key": ("next", "achieved_goal"),
    }

    def parts() -> dict[str, Any]:
        return {"storage": LazyTensorStorage(capacity), "writer": TensorDictRoundRobinWriter()}

    return {
        "torchrl": HERReplayBuffer(lambda td: reached(td).float() - 1, **options, **parts()),
        "rl_app": HindsightReplayBuffer(
            lambda td: reached(td).float() - 1, reached, **options, **parts()
        ),
    }


def test_a_full_her_buffer_still_fails_to_compare_its_cache_key() -> None:
    torchrl, rl_app = her_buffers(capacity=16, strategy="final").values()
    for first in (0, 10):  # the second episode fills the storage
        for buffer in (torchrl, rl_app):
            buffer.extend(episode(first, 8))
            buffer.sample(4)
    torchrl.extend(episode(20, 8))
    with pytest.raises(RuntimeError, match="ambiguous"):
        torchrl.sample(4)
    # rl_app's finds the episodes anew after each write: each step's final goal is the one
    # its own episode ended at.
    for first in (20, 30, 40):
        rl_app.extend(episode(first, 8))
        sample = rl_app.sample(64)
        final = (sample["next", "achieved_goal"] - 1) // 10 * 10 + 8
        assert torch.equal(sample["desired_goal"], final)


def test_her_still_keeps_the_stored_terminated_flag() -> None:
    for name, buffer in her_buffers(capacity=16, strategy="episode").items():
        buffer.extend(episode(0, 4))
        sample = buffer.sample(256)
        stored = sample["next", "achieved_goal"] == 4  # the episode's last step terminated
        assert not torch.equal(reached(sample), stored)  # goals reached elsewhere too
        expected = stored if name == "torchrl" else reached(sample)
        assert torch.equal(sample["next", "terminated"], expected), name


def test_her_still_draws_a_goal_per_step_of_a_slice() -> None:
    def buffer(kind: type) -> HERReplayBuffer:
        extra = {"slice_len": SLICE_LEN} if kind is HindsightReplayBuffer else {}
        functions = (reached,) if kind is HindsightReplayBuffer else ()
        made = kind(
            lambda td: reached(td).float() - 1,
            *functions,
            her_ratio=0.75,
            strategy="future",
            achieved_goal_key=("next", "achieved_goal"),
            storage=LazyTensorStorage(64),
            sampler=slice_sampler(),
            **extra,
        )
        made.extend(episode(0, 8, traj=0))  # achieved 1-8 after each action; 8 terminates
        made.extend(episode(10, 8, traj=1))
        return made

    upstream = buffer(HERReplayBuffer).sample(64 * SLICE_LEN)["desired_goal"]
    assert (upstream.reshape(-1, SLICE_LEN) != upstream.reshape(-1, SLICE_LEN)[:, :1]).any()

    sample = buffer(HindsightReplayBuffer).sample(64 * SLICE_LEN).reshape(-1, SLICE_LEN)
    relabelled, kept = sample[:48], sample[48:]  # the first 0.75 of the slices
    goals = relabelled["desired_goal"]
    assert (goals == goals[:, :1]).all() and (kept["desired_goal"] == UNREACHED).all()
    # One of the goals its first step could take: achieved from that step to the end.
    first, last = relabelled["achieved_goal"][:, :1], torch.where(goals < 10, 8.0, 18.0)
    assert ((first < goals) & (goals <= last[:, :1])).all()
    assert torch.equal(relabelled["next", "desired_goal"], goals)
    # Reward and termination are each step's own for the slice's goal; a step that reaches
    # it ends the sampled trajectory there, as do the slice's end and its episode's.
    assert torch.equal(sample["next", "reward"], reached(sample).float() - 1)
    assert torch.equal(sample["next", "terminated"], reached(sample))
    slice_end = torch.zeros_like(reached(sample))
    slice_end[:, -1] = True
    assert torch.equal(sample["next", "done"], slice_end | reached(sample))
    assert not reached(kept).any()


def test_tensordict_still_reads_the_deprecated_inline_setting() -> None:
    # rl_app.upstream.tensordict.ignore_inline_modules_deprecation. torch warns once per
    # process: read in a fresh one.
    assert "inline_inbuilt_nn_modules" in inspect.getsource(tensordict_utils)
    program = "import torch; torch._dynamo.config.inline_inbuilt_nn_modules"
    done = subprocess.run(
        [PYTHON, "-W", "always", "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "FutureWarning" in line]
    assert any(re.match(INLINE_MODULES_WARNING, line) for line in warned), done.stderr


def test_torch_still_warns_about_cuda_home_without_cuda() -> None:
    # rl_app.upstream.torch.quiet_cuda_home_warning
    from torch.utils import cpp_extension

    assert cpp_extension.logger.name == CPP_EXTENSION_LOGGER
    assert "No CUDA runtime is found" in inspect.getsource(cpp_extension)


def test_a_frozen_trial_keeps_its_storage_id_private() -> None:
    study = optuna.create_study()
    study.ask()
    (frozen,) = study.get_trials()
    assert not any("id" in name for name in dir(frozen) if not name.startswith("_"))
    resumed = resumed_trial(study, frozen)
    resumed.report(1.0, step=10)
    study.tell(resumed, 2.0)
    (done,) = study.get_trials()
    assert done.state.name == "COMPLETE" and done.value == 2.0
    assert done.intermediate_values == {10: 1.0}


# How much more anonymous memory the process holds after a 64 MiB block (over malloc's
# default 128 kB threshold) is written and freed; with ``kept``, after keep_freed_memory.
FREED_BLOCK = """
import ctypes, sys
from rl_app.upstream.glibc import keep_freed_memory
if sys.argv[1] == "kept":
    keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
size = 64 << 20
before = rss_anon()
block = libc.malloc(size)
ctypes.memset(block, 1, size)
libc.free(block)
print(rss_anon() - before)
"""


def held_after_free(mode: str) -> int:
    done = subprocess.run(
        [PYTHON, "-c", FREED_BLOCK, mode], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_glibc_still_returns_a_freed_large_block_to_the_system() -> None:
    assert held_after_free("default") < 8 << 20
    assert held_after_free("kept") > 56 << 20


def test_xdist_groups_still_write_a_node_id_pytest_does_not_read(request) -> None:
    assert "item._nodeid = " in inspect.getsource(WorkerInteractor.pytest_collection_modifyitems)
    item = pytest.Function.from_parent(request.node.parent, name=request.node.name)
    plain = item.nodeid
    item._nodeid = f"{plain}@grouped"  # what the xdist_group marker does
    assert item.nodeid == plain
    send_to_group(item, "grouped")
    assert item.nodeid == f"{plain}@grouped"


class HoldsTensorDictParams(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.params = TensorDictParams(TensorDict({"weight": torch.ones(3, 4)}, []))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.params["weight"]


def test_flop_counter_mode_still_fails_on_a_module_holding_tensordict_params() -> None:
    module, x = HoldsTensorDictParams(), torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="tensordict to boolean"):
        with FlopCounterMode(display=False):
            module(x)
            module(x)
    with MatmulFlops() as counter:
        module(x)
        module(x)
    assert counter.flops == 2 * (2 * 2 * 3 * 4)  # two (2, 3) @ (3, 4) products


def test_a_buffer_still_keeps_these_bytes_per_slot() -> None:
    """rl_app.fit counts per slot: a float32 in each segment tree, saved as a copy of the
    trees and then their leaves, and an int64 generation."""
    sampler = PrioritizedSampler(8, alpha=0.6, beta=0.4)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8),
        sampler=sampler,
        writer=TensorDictRoundRobinWriter(track_generations=True),
    )
    buffer.extend(TensorDict({"a": torch.zeros(4)}, [4]))
    trees = (type(sampler._sum_tree).__name__, type(sampler._min_tree).__name__)
    assert trees == ("SumSegmentTreeFp32", "MinSegmentTreeFp32")
    assert TREE_VALUE_BYTES == torch.float32.itemsize
    assert TREE_LEAF_BYTES == 2 * torch.float32.itemsize
    generations = buffer.writer.generations_of(torch.arange(4))
    assert GENERATION_BYTES == generations.dtype.itemsize == torch.int64.itemsize


def test_segment_trees_still_refuse_sizes_past_the_largest_accepted() -> None:
    """replay.capacity is bounded by SEGMENT_TREE_MAX_SIZE (rl_app.config): one more and a
    tree's std::vector would be larger than it can be."""
    tree_type = type(PrioritizedSampler(8, alpha=0.6, beta=0.4)._sum_tree)
    with pytest.raises(ValueError, match="max_size"):
        tree_type(SEGMENT_TREE_MAX_SIZE + 1)


# -- Ray 2.60.0 and TorchRL's Ray collector (rl_app.upstream.ray) ---------------------------


def test_ray_handles_still_keep_their_hex_id_in_a_private_attribute() -> None:
    from ray.actor import ActorHandle
    from ray.exceptions import RayActorError

    assert isinstance(inspect.getattr_static(ActorHandle, "_actor_id"), property)
    assert "self.actor_id = actor_id" in inspect.getsource(RayActorError.__init__)


def test_an_endless_collector_still_has_a_float_length() -> None:
    from torchrl.data import BoundedContinuous
    from torchrl.envs import GymEnv

    # What RayCollector builds in each actor: Ray's truth test of it raises TypeError.
    collector = Collector(
        lambda: GymEnv("Pendulum-v1"), RandomPolicy(BoundedContinuous(-2, 2, (1,))),
        frames_per_batch=10, total_frames=-1,
    )  # fmt: skip
    try:
        assert collector.total_frames == float("inf")
        with pytest.raises(TypeError, match="'float' object cannot be interpreted"):
            bool(collector)
    finally:
        collector.shutdown()


def test_ray_collector_still_warns_about_policy_factories_and_async_warm_up() -> None:
    from torchrl.collectors.distributed import RayCollector
    from torchrl.collectors.utils import _NON_NN_POLICY_WEIGHTS

    from rl_app.upstream.ray import NOT_APPLYING

    source = inspect.getsource(RayCollector.__init__)
    assert "warnings.warn(_NON_NN_POLICY_WEIGHTS)" in source
    assert _NON_NN_POLICY_WEIGHTS.startswith(NOT_APPLYING[0])
    assert f'"{NOT_APPLYING[1]}' in source.replace("\n", "")


def test_ray_collector_still_stops_at_minus_one_frames_and_splits_the_warm_up() -> None:
    from torchrl.collectors.distributed import RayCollector

    for iterator in (RayCollector._sync_iterator, RayCollector._async_iterator):
        assert "self.collected_frames < self.total_frames" in inspect.getsource(iterator)
    split = "init_random_frames // self.num_collectors"
    assert split in inspect.getsource(RayCollector.__init__)


# -- TorchRL 0.14.1's replay buffer as a Ray service (rl_app.upstream.ray) -------------------


def test_a_prioritized_tensordict_buffer_still_cannot_be_a_ray_service() -> None:
    from torchrl.data import RayReplayBuffer, TensorDictPrioritizedReplayBuffer

    # RayReplayBuffer hands the buffer class delayed_init, which this one does not take.
    assert "delayed_init=delayed_init" in inspect.getsource(RayReplayBuffer.__init__)
    parameters = inspect.signature(TensorDictPrioritizedReplayBuffer.__init__).parameters
    assert "delayed_init" not in parameters
    assert not any(item.kind is item.VAR_KEYWORD for item in parameters.values())


def test_a_ray_service_still_reserves_a_cpu_by_default() -> None:
    from torchrl.collectors.distributed.ray import DEFAULT_REMOTE_CLASS_CONFIG
    from torchrl.data import RayReplayBuffer

    assert DEFAULT_REMOTE_CLASS_CONFIG["num_cpus"] == 1
    # Without a remote_config, the service's actor is made with that default.
    assert "remote_config = DEFAULT_REMOTE_CLASS_CONFIG" in inspect.getsource(
        RayReplayBuffer.as_remote
    )


def test_a_collector_writing_into_a_buffer_still_counts_the_buffer_s_frames() -> None:
    from rl_app.upstream.ray import TruthfulCollector, warm_up_frames

    # Each step asks the (shared) buffer's count, not the actor's own share of frames.
    source = inspect.getsource(Collector._should_use_random_frames)
    assert "self.replay_buffer.write_count < self.init_random_frames" in source
    assert "_should_use_random_frames()" in inspect.getsource(Collector.rollout)
    assert "_should_use_random_frames" in vars(TruthfulCollector)
    # Handed to RayCollector, which gives each of 2 actors half: each then waits for 400.
    assert warm_up_frames(400, 2, shared_buffer=True) // 2 == 400
    assert warm_up_frames(401, 2, shared_buffer=False) // 2 == 201


def test_ray_collection_into_a_buffer_still_leaves_batches_in_flight() -> None:
    from torchrl.collectors.distributed import RayCollector

    # Asynchronous: the frame count adds a whole batch per batch, and at the end waits for
    # the batches still in flight, which land in the buffer uncounted.
    iterator = inspect.getsource(RayCollector._async_iterator)
    assert "self.collected_frames += self.frames_per_batch" in iterator
    assert "ray.wait(refs, num_returns=len(refs))" in iterator
    # pause() stops the thread that asks for batches, not the batches it asked for.
    pause = inspect.getsource(RayCollector.pause)
    assert "thread.join" in pause and "ray.wait" not in pause and "ray.get" not in pause


# -- TorchRL 0.14.1's RPC collector (rl_app.upstream.torchrl_collectors) ----------------------


def test_rpc_collector_still_shifts_the_first_frames_ids() -> None:
    from torchrl.collectors.distributed import RPCCollector

    from rl_app.upstream.torchrl_collectors import undo_rpc_trajectory_id_shift

    source = inspect.getsource(RPCCollector._next_sync_rpc)
    assert "data = torch.cat(data)" in source
    assert "traj_ids[i] += traj_ids[i - 1].max()" in source
    assert "self._collected_frames < self.total_frames" in inspect.getsource(RPCCollector.iterator)
    shifted = torch.tensor([4, 5, 6, 7])
    for i in range(1, 3):  # as TorchRL does, with 3 workers
        shifted[i] += shifted[i - 1].max()
    assert undo_rpc_trajectory_id_shift(shifted, 3).tolist() == [4, 5, 6, 7]


def test_an_rpc_worker_error_still_names_its_node() -> None:
    from torchrl.collectors.distributed import rpc as torchrl_rpc

    from rl_app.upstream.torchrl_collectors import rpc_worker_of

    assert 'f"COLLECTOR_NODE_{rank}"' in inspect.getsource(torchrl_rpc._rpc_init_collection_node)
    error = RuntimeError("On WorkerInfo(id=2, name=COLLECTOR_NODE_2):\nValueError('x')\nTrace")
    assert rpc_worker_of(error) == (1, "ValueError('x')")
    assert rpc_worker_of(RuntimeError("Connection closed by peer")) is None


def test_rpc_collector_still_starts_its_nodes_with_this_entry_point() -> None:
    from torchrl.collectors.distributed import RPCCollector
    from torchrl.collectors.distributed import rpc as torchrl_rpc

    parameters = inspect.signature(torchrl_rpc._rpc_init_collection_node).parameters
    assert list(parameters) == [
        "rank", "rank0_ip", "tcp_port", "world_size", "visible_device", "tensorpipe_options",
        "backend", "verbose",
    ]  # fmt: skip
    init = inspect.getsource(RPCCollector._init)
    assert 'executor = submitit.AutoExecutor(folder="log_test")' in init
    assert "IPAddr = socket.gethostbyname(hostname)" in init
    launch = inspect.getsource(RPCCollector._init_worker_rpc)
    delayed = 'elif self.launcher == "submitit_delayed":\n            # job is already launched'
    assert delayed in launch
    shutdown = inspect.getsource(RPCCollector.shutdown)
    assert 'elif self.launcher == "submitit_delayed":\n            pass' in shutdown


# One RPC group in a fresh process, then a second in the same process: what each uses to
# meet the other processes of its group.
TWO_RPC_GROUPS = """
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api
from rl_app.upstream.torchrl_collectors import free_local_port, rpc_started_in_this_process

for group in range(2):
    print(rpc._init_counter, dict(api._all_gather_sequence_id), rpc_started_in_this_process())
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{free_local_port()}")
    rpc.init_rpc("TRAINER_NODE", rank=0, world_size=1, rpc_backend_options=options)
    rpc.shutdown()
"""


def test_a_second_rpc_group_in_a_process_still_uses_other_keys() -> None:
    # torch prefixes a group's rendezvous keys with the count of this process's init_rpc
    # calls ("rpc_prefix_<count>") and numbers its all-gathers per process: a second group
    # meets its fresh workers (count 0, all-gather 0) under other keys and waits for ever.
    # rpc mode refuses a second RPC collector in a process (rl_app/collection/rpc.py).
    import torch.distributed.rpc as rpc

    assert 'dist.PrefixStore(str(f"rpc_prefix_{_init_counter}"), store)' in inspect.getsource(
        rpc.init_rpc
    )
    done = subprocess.run(
        [sys.executable, "-c", TWO_RPC_GROUPS], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "0 {} False"
    assert second == "1 {'TRAINER_NODE': 2} True"


# TorchRL's asynchronous RPC collection with one worker acting with a linear policy: after
# each batch the learner pushes new weights. Prints, per batch, the versions its frames acted
# with (recomputed from observation and action; -1: weights never sent).
ASYNC_RPC_PUSHES = """
import torch
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.collectors.distributed import RPCCollector
from torchrl.envs import GymEnv
from rl_app.upstream.torchrl_collectors import UNBOUNDED_FRAMES, free_local_port


def make_env():
    return GymEnv("Pendulum-v1")


def make_policy():
    return TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])


def set_weights(policy, version):
    with torch.no_grad():
        policy.module.weight.fill_(0.1 * version)
        policy.module.bias.fill_(-0.05 * version)


if __name__ == "__main__":
    learner = make_policy()
    collector = RPCCollector(
        [make_env], policy_factory=make_policy, frames_per_batch=600,
        total_frames=UNBOUNDED_FRAMES,
        sync=False, launcher="mp", tcp_port=free_local_port(), collector_class=Collector,
        collector_kwargs={"track_policy_version": True},
    )
    set_weights(learner, 1)
    collector.update_policy_weights_(learner)
    for index, batch in enumerate(collector):
        versions = torch.full((len(batch),), -1)
        for version in range(1, index + 2):
            set_weights(learner, version)
            with torch.no_grad():
                acted = learner(batch.select("observation").clone())["action"]
            versions[(acted - batch["action"]).abs().squeeze(-1) < 1e-5] = version
        print(sorted(set(versions.tolist())), flush=True)
        if index == 5:
            break
        set_weights(learner, index + 2)
        collector.update_policy_weights_(learner)
    collector.shutdown()
"""


@pytest.mark.rpc
def test_async_rpc_collection_still_mixes_weights_within_a_batch(tmp_path: Path) -> None:
    # The worker applies a push on an RPC thread while its collector steps: a batch
    # collected across a push acts with two versions. rpc mode refuses rpc.sync=false.
    script = tmp_path / "async_rpc_pushes.py"
    script.write_text(ASYNC_RPC_PUSHES)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    per_batch = [ast.literal_eval(line) for line in done.stdout.splitlines()]
    assert len(per_batch) == 6
    assert any(len([v for v in versions if v > 0]) > 1 for versions in per_batch), per_batch


@pytest.mark.parametrize("sampler", ["prioritized", "prioritized_slice", "prioritized_sequence"])
def test_priority_trees_stay_on_the_cpu_beside_a_storage_on_a_gpu_stand_in(sampler: str) -> None:
    # No GPU storage can be made here: a CPU storage that says it is on a GPU stands in
    # (TorchRL places the trees by the storage's device alone).
    storage = LazyTensorStorage(100)
    storage.device = torch.device("cuda", 0)
    replay = ReplayConfig(sampler=sampler, capacity=100)
    if torchrl.data.replay_buffers.samplers.prioritized.CudaSumSegmentTreeFp32 is None:
        moved = make_sampler(replay)
        moved._device = None  # TorchRL's own placement
        with pytest.raises(RuntimeError, match="require a TorchRL CUDA wheel"):
            moved._maybe_init_from_storage(storage)
    kept = make_sampler(replay)  # rl_app.upstream.torchrl.keep_priority_trees_on_cpu
    kept._maybe_init_from_storage(storage)
    assert kept.device == torch.device("cpu") and kept._sum_tree is not None
