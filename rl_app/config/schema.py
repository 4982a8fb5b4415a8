"""Every setting of a run: a typed schema, each key with its meaning and accepted values.

:class:`RunConfig` is a whole run: the core groups declared here, and each algorithm's
own group (:mod:`~rl_app.config.algorithms`). Which algorithms a run may name is the
registry's (:mod:`rl_app.algorithms`), checked by :func:`rl_app.checks.check_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_app.config.algorithms import DQNConfig, SACConfig, TD3Config
from rl_app.config.settings import setting

# TorchRL's C++ segment trees (every prioritized sampler) hold 2 x the power of two above
# their size in a std::vector<float>: larger sizes raise (from 2**59) or never return
# (from 2**62, the power of two overflows).
SEGMENT_TREE_MAX_SIZE = 2**59 - 1
# More torch threads than the largest nodes have cores: OpenMP fails to start some
# thousands on small machines, and crashed the process at 100,000.
MAX_THREADS = 1024
# NumPy's and Gymnasium's seeds are unsigned 32-bit integers.
MAX_SEED = 2**32 - 1

DEVICE_DOC = "auto | cpu | cuda | cuda:N"


@dataclass
class EnvConfig:
    """The environment trained on."""

    name: str = setting("Pendulum-v1", "Gymnasium environment id, or module:id")
    num_envs: int = setting(
        1, "envs stepped as one batch by each collector (a vector env)", at_least=1
    )
    normalize_observations: bool = setting(
        False,
        "shift and scale observations to zero mean and unit variance, with statistics of "
        "random play from a fixed seed (TorchRL's ObservationNorm; the same in every env)",
    )
    observation_indices: list[int] | None = setting(  # noqa: RUF009
        None,
        "keep only these entries of a Box observation, e.g. [0, 2]: CartPole without its "
        "velocities (unset: the whole observation)",
        at_least=0,
    )
    max_episode_steps: int | None = setting(
        None,
        "end episodes (truncated) after this many agent steps, on top of the env's own limit "
        "(unset: the env's own only; Atari games end at 108,000 frames = 27,000 steps)",
        at_least=1,
    )
    life_loss_terminal: bool = setting(
        False,
        "Atari: a lost life ends the learner's n-step targets as a terminal would, while the "
        "game goes on (DrQ(eps) and Dopamine train so); needs optim.target=nstep_transition",
    )


@dataclass
class NetworkConfig:
    """Sizes of the policy and value networks."""

    # A tuple default: setting() gives each config its own list of it.
    hidden_sizes: list[int] = setting((256, 256), "hidden layer widths of every MLP", at_least=1)  # noqa: RUF009
    recurrent: str = setting(
        "none",
        "none | lstm: an LSTM between the MLP and the Q-values (algo=dqn), its state carried "
        "through each episode and stored with every frame",
        choices=("none", "lstm"),
    )
    lstm_size: int = setting(64, "size of the LSTM's state (network.recurrent=lstm)", at_least=1)


@dataclass
class CollectorConfig:
    """How environment frames are gathered."""

    total_frames: int = setting(20_000, "environment frames to train for", at_least=1,
                                on_resume=True)  # fmt: skip
    frames_per_batch: int = setting(200, "frames collected per training iteration", at_least=1)
    init_random_frames: int = setting(
        1_000, "frames of uniform random actions before learning", at_least=0
    )
    mode: str = setting(
        "direct",
        "direct (in-process) | sync | async (worker processes) | distributed (SLURM jobs) "
        "| ray (Ray actors: the ray group) | rpc (TorchRL's RPC collector: the rpc group)",
        choices=("direct", "sync", "async", "distributed", "ray", "rpc"),
    )
    workers: int = setting(
        2, "worker processes (sync, async, ray and rpc modes; distributed: one collector per job)",
        at_least=1,
    )  # fmt: skip
    nodes: int = setting(2, "collection jobs submitted to SLURM (distributed mode)", at_least=1)
    address: str | None = setting(
        None, "address collection jobs reach the learner at (distributed, rpc; unset: this host's)"
    )
    port: int | None = setting(
        None,
        "learner's rendezvous TCP port (distributed, rpc; unset: a free one; +1, +2 used too)",
        at_least=1024, at_most=65533,
    )  # fmt: skip
    connect_timeout_s: int = setting(
        600, "how long collection jobs may take to start and join (distributed mode)", at_least=1
    )
    device: str = setting("cpu", "where worker processes run the policy: cpu | cuda | cuda:N")
    sync_every: int = setting(
        1, "push learner weights to the workers every N iterations", at_least=1
    )
    compile_policy: bool = setting(
        False, "torch.compile the acting policy (faster stepping after a few seconds' compile)"
    )


@dataclass
class OptimConfig:
    """The learner's updates."""

    lr: float = setting(3e-4, "Adam learning rate of every network", above=0)
    anneal_lr: bool = setting(
        False,
        "decay the learning rate linearly from optim.lr to 0 over collector.total_frames",
    )
    batch_size: int = setting(256, "transitions per gradient update", at_least=1)
    utd_ratio: float = setting(1.0, "gradient updates per collected frame", above=0)
    gamma: float = setting(0.99, "discount factor", at_least=0, at_most=1)
    target: str = setting(
        "td0",
        "value target: td0 | nstep (rewards to the slice end, then bootstrap) | td_lambda "
        "(TD(lambda) over each slice) | nstep_transition (each sampled slice is one n-step "
        "transition, its first step's, n = replay.slice_len; optim.batch_size counts "
        "transitions); multi-step targets need a slice sampler",
        choices=("td0", "nstep", "td_lambda", "nstep_transition"),
    )
    lmbda: float = setting(0.9, "lambda of optim.target=td_lambda", at_least=0, at_most=1)
    compile: bool = setting(
        False,
        "torch.compile the loss: faster updates after a one-time compile (cached on disk)",
        on_resume=True,
    )
    cudagraphs: bool = setting(
        False,
        "capture each update in a CUDA graph, replayed in one launch (a CUDA learner only)",
        on_resume=True,
    )
    fused_adam: bool = setting(
        True,
        "Adam's fused kernel: one kernel steps every parameter (same steps up to float rounding)",
    )
    adam_eps: float = setting(
        1e-8, "Adam's epsilon, added to the root of its second moment (DrQ(eps): 1.5e-4)", above=0
    )


@dataclass
class ReplayConfig:
    """The replay buffer (memmap storage inside the run directory, or GPU memory)."""

    capacity: int = setting(
        100_000, "transitions kept in the buffer", at_least=1, at_most=SEGMENT_TREE_MAX_SIZE
    )
    sampler: str = setting(
        "prioritized_slice",
        "prioritized_slice | slice | prioritized_sequence (TorchRL's Sequence windows: "
        "replay.burn_in steps, then replay.slice_len learning steps, padded and masked at "
        "episode ends) | prioritized | uniform",
        choices=("prioritized_slice", "slice", "prioritized_sequence", "prioritized", "uniform"),
    )
    slice_len: int = setting(
        8, "consecutive steps per sampled slice or sequence (sequence samplers)", at_least=1
    )
    burn_in: int = setting(
        0,
        "steps before each sampled sequence that only warm up the recurrent state: no loss "
        "(replay.sampler=prioritized_sequence)",
        at_least=0,
    )
    refresh_states: bool = setting(
        True,
        "write the recurrent states the learner recomputes back into the sampled records "
        "that are still in the buffer (network.recurrent=lstm)",
    )
    her_ratio: float = setting(
        0.0,
        "hindsight experience replay: the fraction of each sampled batch whose goal is "
        "replaced by one its episode achieved (0: off; a goal env, algo=dqn, sac or td3 with "
        "an MLP; a slice takes one goal for all its steps)",
        at_least=0, at_most=1,
    )  # fmt: skip
    her_strategy: str = setting(
        "future",
        "the achieved goal a transition is relabelled with: future (after a step from it to "
        "its episode's end) | final (after its episode's last step) | episode (after any step "
        "of its episode)",
        choices=("future", "final", "episode"),
    )
    # Both in [0, 1] as in Schaul et al. (2016): 1 is sampling in proportion to the TD error
    # and weights that undo the bias whole; a much larger one overflows to NaN in a few steps.
    alpha: float = setting(0.6, "priority exponent (prioritized samplers)", at_least=0, at_most=1)
    beta: float = setting(
        0.4, "importance-weight exponent (prioritized samplers)", at_least=0, at_most=1
    )
    prefetch: bool = setting(
        False,
        "sample each update's batch in a background thread while the update before it runs "
        "(one sampler call per batch instead of one per iteration: the same draws, but other "
        "ones, as random, with replay.sampler=slice; not with replay.her_ratio)",
        on_resume=True,
    )
    device: str = setting(
        "cpu",
        "where replay data are stored: cpu (memory-mapped files in the run directory) | cuda | "
        "cuda:N (GPU memory: no host-to-GPU copy per batch)",
    )
    service: str = setting(
        "none",
        "none (the buffer lives in the learner's process) | ray (a Ray actor owns it, and the "
        "collector.mode=ray actors write their batches into it directly)",
        choices=("none", "ray"),
    )


@dataclass
class EvalConfig:
    """Deterministic evaluation, which also picks the best checkpoint."""

    interval_frames: int = setting(
        2_000, "evaluate every N collected frames", at_least=1, on_resume=True
    )
    episodes: int = setting(10, "episodes per evaluation", at_least=1, on_resume=True)
    backend: str = setting(
        "blocking",
        "blocking (training waits for the evaluation) | process (it plays in a process of "
        "its own while training goes on, with the weights of the frame it was due at) | ray "
        "(as process, in an actor on the Ray cluster of collector.mode=ray)",
        choices=("blocking", "process", "ray"),
        on_resume=True,
    )
    video: bool = setting(
        False, "record an evaluation episode and send it to the logger backend", on_resume=True
    )
    video_every: int = setting(
        1, "record the video at every N-th evaluation (eval.video=true)", at_least=1,
        on_resume=True,
    )  # fmt: skip


@dataclass
class CheckpointConfig:
    """Checkpoints saved after each evaluation, on a stop, and every ``interval_minutes``."""

    keep_last: int = setting(
        2, "most recent checkpoints kept (the best is kept too)", at_least=1, on_resume=True
    )
    interval_minutes: float = setting(
        5.0, "also save at the first iteration boundary this long after the last save "
        "(0: every iteration)", at_least=0, on_resume=True,
    )  # fmt: skip


@dataclass
class LoggerConfig:
    """Where metrics go (metrics.jsonl and curve.png are always written)."""

    backend: str = setting(
        "csv", "none | csv | wandb | tensorboard",
        choices=("none", "csv", "wandb", "tensorboard"), on_resume=True,
    )  # fmt: skip
    project: str = setting("rl_app", "wandb project name", on_resume=True)


@dataclass
class SlurmConfig:
    """SLURM launch (launcher=slurm): a profile from slurm/profiles/, overridable key by key.
    Profile values are checked against the cluster when submitting."""

    profile: str = setting("local", "cluster profile: slurm/profiles/<profile>.yaml")
    partition: str | None = setting(None, "partition (unset: the profile's)")
    account: str | None = setting(None, "account (unset: the profile's)")
    qos: str | None = setting(None, "quality of service (unset: the profile's)")
    time_min: int | None = setting(None, "time limit in minutes (unset: the profile's)")
    gpus_per_node: int | None = setting(None, "GPUs for the job (unset: the profile's)")
    cpus_per_task: int | None = setting(None, "CPUs for the job (unset: the profile's)")
    nodes: int | None = setting(
        None, "nodes for the job, collector.mode=ray only (unset: the profile's, 1)"
    )
    mem_gb: int | None = setting(None, "memory in GB (unset: the profile's)")
    constraint: str | None = setting(None, "node constraint (unset: the profile's)")
    signal_delay_s: int | None = setting(None, "USR2 this long before the time limit")
    max_requeues: int | None = setting(None, "preemptions/timeouts a job may be requeued for")
    array: str | None = setting(None, "one job per value of one key, e.g. seed=1,2,3")
    collector_partition: str | None = setting(
        None, "partition of collection jobs (collector.mode=distributed; unset: the job's)"
    )
    collector_cpus_per_task: int | None = setting(
        None, "CPUs of each collection job (unset: the job's, slurm.cpus_per_task)"
    )
    collector_mem_gb: int | None = setting(None, "memory of each collection job in GB")
    collector_time_min: int | None = setting(
        None, "time limit of collection jobs in minutes (unset: the job's)"
    )


@dataclass
class RayConfig:
    """The Ray cluster of ``collector.mode=ray``."""

    address: str | None = setting(
        None,
        "host:port of a running Ray cluster to join and leave running (unset: start a local "
        "Ray with this machine's CPUs and shut it down at the end)",
        on_resume=True,
    )
    sync: bool = setting(
        True,
        "gather each batch from every collector actor (true), or take the batch of whichever "
        "actor is ready first while the others keep collecting (false)",
    )
    worker_cpus: float = setting(
        1.0, "CPUs each collector actor, and the evaluation's with eval.backend=ray, reserves "
        "(Ray places an actor only where they are free)",
        above=0, on_resume=True,
    )  # fmt: skip
    max_actor_replacements: int = setting(
        3,
        "times a collector actor whose process died is replaced by a new one before the run "
        "stops naming it (0: stop at the first death)",
        at_least=0,
    )


@dataclass
class RpcConfig:
    """TorchRL's RPC collector of ``collector.mode=rpc`` (``collector.workers`` workers)."""

    launcher: str = setting(
        "local",
        "local (worker processes on this machine) | slurm (one SLURM job per worker, "
        "slurm.collector_* settings, as distributed mode)",
        choices=("local", "slurm"),
    )
    sync: bool = setting(
        True,
        "gather each batch from every worker (true); false (first-ready batches) is refused: "
        "TorchRL's asynchronous RPC collection applies a weight push while a worker acts",
    )


@dataclass
class RunConfig:
    """A whole run."""

    launcher: str = setting(
        "local", "local (train here) | slurm (submit with submitit)",
        choices=("local", "slurm"), on_resume=True,
    )  # fmt: skip
    # The names accepted are the algorithm registry's (rl_app.algorithms.ALGORITHMS).
    algo: str = setting("sac", "the algorithm, and the key of its own group of settings")
    seed: int = setting(0, "seed of every random number generator", at_least=0, at_most=MAX_SEED)
    device: str = setting("auto", f"learner device: {DEVICE_DOC}")
    threads: int = setting(
        1, "torch intra-op threads (one is fastest on small machines)", at_least=1,
        at_most=MAX_THREADS, on_resume=True,
    )  # fmt: skip
    run_dir: str | None = setting(
        None, "where the run's files go (default runs/<preset>-<time>)", on_resume=True
    )
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    slurm: SlurmConfig = field(default_factory=SlurmConfig, metadata={"on_resume": True})
    ray: RayConfig = field(default_factory=RayConfig)
    rpc: RpcConfig = field(default_factory=RpcConfig)


# The name the package's type hints give a run's config.
Config = RunConfig
