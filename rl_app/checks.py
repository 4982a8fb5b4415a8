"""A run's config, loaded with every algorithm's settings and checked by every owner before
anything is created: what ``train.py``, the sweep, ``play`` and the tests load.

The checks live with what they check (:mod:`rl_app.algorithms`, :mod:`rl_app.envs.checks`,
:mod:`rl_app.envs.atari`, :mod:`rl_app.replay.checks`); :func:`check_config` runs them in
one order, with the checks of the learner's machine and collection that are kept here.
"""

from __future__ import annotations

import os
import socket

import torch

from rl_app import config as loading
from rl_app.algorithms import (
    available_algorithms,
    check_actions,
    check_algorithm,
    check_settings,
    describe_algorithms,
)
from rl_app.config import Config, ConfigError, check_declared
from rl_app.envs import checks as env_checks
from rl_app.envs import observes_frames
from rl_app.replay import checks as replay_checks


def load_config(preset: str | None = None, overrides: list[str] | None = None) -> Config:
    """Merge defaults, a preset (None: the default one, or a resumed run's own) and
    ``key=value`` overrides into a :class:`Config` that every owner accepts
    (:func:`rl_app.config.resolve_config`, then :func:`check_config`); every mistake raises
    :class:`ConfigError`."""
    config = loading.resolve_config(preset, overrides or [])
    check_config(config)
    return config


def describe_settings(preset: str) -> str:
    """Every group and key of a run, with its value in ``preset`` (what a run of it uses
    unless overridden) and its meaning (``train.py --help``)."""
    return loading.describe_settings(loading.preset_config(preset), {"algo": describe_algorithms()})


def check_config(config: Config) -> None:
    """Raise :class:`ConfigError` naming the first key that does not fit the others, the env
    or this machine."""
    check_declared("algo", config.algo, {"choices": tuple(available_algorithms())})
    for key, device in (
        ("device", config.device),
        ("collector.device", config.collector.device),
        ("replay.device", config.replay.device),
    ):
        check_device(key, device, allow_auto=key == "device")
    check_cudagraphs(config)
    check_collection(config)
    check_ray(config)
    check_replay_service(config)
    check_rpc(config)
    check_rendezvous_port(config)
    replay_checks.check_value_target(config)
    replay_checks.check_capacity(config)
    replay_checks.check_burn_in(config)
    check_algorithm(config)
    replay_checks.check_recurrent_sequences(config)
    env_checks.check_env_registered(config.env.name)
    check_actions(config, env_checks.check_spaces(config.env))
    replay_checks.check_hindsight(config)
    env_checks.check_goal_env(config)
    check_settings(config)
    if observes_frames(config.env.name):  # a plug-in: imported for such an env only
        from rl_app.envs.atari import check_atari

        check_atari(config)
    replay_checks.check_life_loss(config)
    replay_checks.check_slices(config, env_checks.max_episode_steps(config.env))
    check_video(config)
    check_background_evaluation(config)
    check_wandb_project(config)


def check_wandb_project(config: Config) -> None:
    """A project name wandb accepts, by wandb's own rule (which it applies only at the
    first metrics row it is sent)."""
    if config.logger.backend != "wandb":
        return
    import wandb

    try:
        wandb.Settings(project=config.logger.project)
    except wandb.errors.UsageError as error:
        reason = str(error).splitlines()[0].partition(": ")[2]
        raise ConfigError(
            f"logger.project={config.logger.project!r} is not accepted by wandb: {reason}"
        ) from None


def check_device(key: str, device: str, allow_auto: bool) -> None:
    """``cpu``, ``cuda`` or ``cuda:N`` (and ``auto`` where allowed), on a GPU this machine has."""
    kind, _, index = device.partition(":")
    accepted = "auto, cpu, cuda or cuda:N" if allow_auto else "cpu, cuda or cuda:N"
    if (allow_auto and device == "auto") or device == "cpu":
        return
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"{key}={device!r} is not accepted: choose {accepted}")
    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError(
            f"{key}={device!r} is not available: this machine has no CUDA GPU (use cpu"
            + (" or auto)" if allow_auto else ")")
        )
    if index and int(index) >= count:
        raise ConfigError(
            f"{key}={device!r} is not available: this machine has {count} CUDA GPU(s), "
            f"cuda:0 to cuda:{count - 1}"
        )


def check_cudagraphs(config: Config) -> None:
    """CUDA graphs need the learner on a GPU (``check_device`` has checked that one exists)
    and a constant learning rate."""
    if not config.optim.cudagraphs:
        return
    if config.optim.anneal_lr:
        raise ConfigError(
            "optim.anneal_lr=true cannot be combined with optim.cudagraphs=true: a captured "
            "update keeps the learning rate it was recorded with"
        )
    if config.device.startswith("cuda"):
        return
    if config.device == "cpu" or not torch.cuda.is_available():
        raise ConfigError(
            f"optim.cudagraphs=true needs a CUDA learner, but device={config.device!r} "
            + ("runs on the CPU" if config.device == "cpu" else "finds no CUDA GPU here")
            + ": set device=cuda on a GPU machine, or optim.cudagraphs=false"
        )


def check_collection(config: Config) -> None:
    """A run collects at least one batch; a batch gathered from every worker (sync, rpc,
    ray with ``ray.sync``) or collection job (distributed) is split evenly among them, and
    every collector's share is a whole number of steps of its
    ``env.num_envs`` envs."""
    collector, num_envs = config.collector, config.env.num_envs
    if collector.total_frames < collector.frames_per_batch:
        raise ConfigError(
            f"collector.total_frames={collector.total_frames} is out of range: "
            f"it must be at least collector.frames_per_batch={collector.frames_per_batch}"
        )
    gathered = collector.mode in ("sync", "rpc") or (collector.mode == "ray" and config.ray.sync)
    if gathered and collector.frames_per_batch % collector.workers:
        raise ConfigError(
            f"collector.frames_per_batch={collector.frames_per_batch} is not accepted: "
            f"in {collector.mode} mode it is split evenly among "
            f"collector.workers={collector.workers}"
        )
    if collector.mode == "distributed":
        if collector.frames_per_batch % collector.nodes:
            raise ConfigError(
                f"collector.frames_per_batch={collector.frames_per_batch} is not accepted: in "
                f"distributed mode it is split evenly among collector.nodes={collector.nodes}"
            )
    sources = collector.nodes if collector.mode == "distributed" else 1
    if gathered:
        sources = collector.workers
    if (collector.frames_per_batch // sources) % num_envs:
        raise ConfigError(
            f"env.num_envs={num_envs} is not accepted: each collector's share of "
            f"collector.frames_per_batch={collector.frames_per_batch} must be a whole number "
            f"of steps of its {num_envs} envs"
        )


def check_ray(config: Config) -> None:
    """``collector.mode=ray`` needs Ray installed, a reachable ``ray.address``, actors on the
    CPU, and CPUs for every actor: Ray would leave an actor it cannot place waiting for
    ever. A set address is joined here, and left, to read its CPUs."""
    if config.collector.mode != "ray":
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "collector.mode=ray needs Ray, which is not installed: pip install ray==2.60.0 "
            "(requirements.txt), or choose collector.mode direct, sync, async or distributed"
        ) from None
    if config.collector.device != "cpu":
        raise ConfigError(
            f"collector.device={config.collector.device!r} is not accepted with "
            "collector.mode=ray: Ray actors act on the CPU (cpu)"
        )
    address = config.ray.address
    if address is None and config.launcher == "slurm":
        return  # the job starts its own Ray: rl_app.launch.slurm counts the job's allocation
    cpus = ray_cluster_cpus(address) if address else float(machine_cpus())
    asked, asking, fewer = ray_actor_cpus(config)
    if asked > cpus:
        where = f"the Ray cluster at {address}" if address else "this machine"
        raise ConfigError(f"{asking} asks {asked:g} CPUs, and {where} has {cpus:g}: {fewer}")


def ray_actor_cpus(config: Config) -> tuple[float, str, str]:
    """The CPUs a Ray run's actors reserve (its collectors', and the evaluation's with
    ``eval.backend=ray``), the settings that ask them and those that can ask fewer, in
    words."""
    actors, asking = config.collector.workers, f"collector.workers={config.collector.workers}"
    fewer = "lower collector.workers or ray.worker_cpus (a fraction is accepted)"
    if config.eval.backend == "ray":
        actors, asking = actors + 1, f"{asking} and eval.backend=ray (one actor more)"
        fewer += ", or evaluate with eval.backend=process"
    cpus = config.ray.worker_cpus
    return actors * cpus, f"{asking} with ray.worker_cpus={cpus:g}", fewer


# What a replay service's actor runs: rl_app's buffer with one of these samplers, and no
# feature that needs the learner's env or networks.
SERVICE_SAMPLERS = ("prioritized_slice", "slice", "prioritized", "uniform")


def check_replay_service(config: Config) -> None:
    """``replay.service=ray`` is written into by ``collector.mode=ray`` actors, and stores
    on the CPU what its actor can sample alone: hindsight relabelling (the learner's goal
    env), Sequence windows, recurrent states (the learner's network) and frames stored
    once (a transform holding the storage) stay in-process, and so do n-step transitions
    (made of the sampled slices). Its actor reserves no CPU."""
    replay = config.replay
    if replay.service == "none":
        return
    in_process = "replay.service=none keeps the buffer in the learner's process"
    if config.collector.mode != "ray":
        raise ConfigError(
            f"replay.service=ray needs collector.mode=ray (its actors write into the service), "
            f"not collector.mode={config.collector.mode!r}; {in_process}"
        )
    refused = None
    if replay.device != "cpu":
        refused = f"replay.device={replay.device!r}", "its actor stores on the cpu"
    elif replay.sampler not in SERVICE_SAMPLERS:
        refused = f"replay.sampler={replay.sampler!r}", f"it runs {', '.join(SERVICE_SAMPLERS)}"
    elif replay.her_ratio:
        refused = f"replay.her_ratio={replay.her_ratio:g}", "relabelling needs the goal env: 0"
    elif config.network.recurrent != "none":
        refused = f"network.recurrent={config.network.recurrent!r}", "states need the learner"
    elif observes_frames(config.env.name):
        refused = f"env.name={config.env.name!r}", "frames stored once need the learner's env"
    elif config.optim.target == replay_checks.NSTEP_TRANSITION:
        refused = (
            f"optim.target={replay_checks.NSTEP_TRANSITION!r}",
            "the service samples slices as they are",
        )
    if refused is not None:
        setting, why = refused
        raise ConfigError(
            f"{setting} is not accepted with replay.service=ray ({why}); {in_process}"
        )


def check_rpc(config: Config) -> None:
    """``collector.mode=rpc``: workers act on the CPU (TorchRL maps no device for them), and
    each batch is gathered from all of them."""
    if config.collector.mode != "rpc":
        return
    if config.collector.device != "cpu":
        raise ConfigError(
            f"collector.device={config.collector.device!r} is not accepted with "
            "collector.mode=rpc: RPC workers act on the CPU (cpu)"
        )
    if not config.rpc.sync:
        raise ConfigError(
            "rpc.sync=false is not accepted: TorchRL's asynchronous RPC collection applies a "
            "weight push while a worker acts, mixing weights within a batch; accepted: true"
        )


def check_rendezvous_port(config: Config) -> None:
    """A ``collector.port`` given is bound on this machine by the learner's rendezvous
    (distributed, rpc), and the next two ports with it: each must be free here."""
    port = config.collector.port
    if port is None or config.collector.mode not in ("distributed", "rpc"):
        return
    if config.launcher != "local":  # the learner binds it where its job runs
        return
    for taken in (port, port + 1, port + 2):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a rendezvous does
            try:
                probe.bind(("", taken))
            except OSError as error:
                raise ConfigError(
                    f"collector.port={port}: port {taken}, which the learner binds, is in use "
                    f"here ({error.strerror}): give another, or leave collector.port unset for "
                    "a free one"
                ) from None


def machine_cpus() -> int:
    """The CPUs this process may run on: what a local Ray is started with."""
    return len(os.sched_getaffinity(0))


# How long a Ray cluster's address is given to answer.
RAY_CONNECT_TIMEOUT_S = 5.0
# What a gRPC client sends first (HTTP/2's preface and an empty SETTINGS frame), and the
# type of the frame a gRPC server, as Ray's GCS is, answers with (SETTINGS).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04" + bytes(5)
HTTP2_SETTINGS = 4


def ray_cluster_cpus(address: str) -> float:
    """The CPUs of the Ray cluster at ``address`` (``host:port``), joined and left here."""
    host, _, port = address.rpartition(":")
    if "://" in address:  # ray://: a Ray Client's, whose actors run through a proxy
        raise ConfigError(
            f"ray.address={address!r} is not accepted: give the cluster's host:port (its GCS "
            "address, as ray start --head prints it); Ray Client addresses are not supported"
        )
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"ray.address={address!r} is not accepted: give host:port, the port in [1, 65535]"
        )
    try:
        connection = socket.create_connection((host, int(port)), RAY_CONNECT_TIMEOUT_S)
    except OSError as error:
        raise ConfigError(
            f"ray.address={address!r} is unreachable ({error.strerror or error}): start the "
            "cluster (ray start --head) or unset ray.address to start a local Ray"
        ) from None
    # Another server there would keep Ray's connect retrying for ever. (A cluster with TLS,
    # RAY_USE_TLS=1, answers only a TLS client.)
    plain = os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true")
    with connection:
        if plain and not answers_grpc(connection):
            raise ConfigError(
                f"ray.address={address!r} answers, but not as a Ray cluster: give the "
                "address ray start --head prints (its GCS port, 6379 by default, not the "
                "dashboard's)"
            )
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return ray.cluster_resources().get("CPU", 0.0)
    ray.init(address=address, log_to_driver=False)
    try:
        return ray.cluster_resources().get("CPU", 0.0)
    finally:
        ray.shutdown()


def answers_grpc(connection: socket.socket) -> bool:
    """Whether the server at the other end of ``connection`` speaks HTTP/2, as gRPC does:
    it answers a client's preface with its SETTINGS frame."""
    try:
        connection.sendall(HTTP2_PREFACE)
        with connection.makefile("rb") as reader:
            header = reader.read(9)  # a frame header: its length, type, flags, stream
    except OSError:  # no answer in time, or the connection dropped
        return False
    return len(header) == 9 and header[3] == HTTP2_SETTINGS


def check_video(config: Config) -> None:
    """A run asked to record videos must be able to render its env headless and to encode
    for its logger backend: checked here, so that it fails at start and not mid-run."""
    if not config.eval.video:
        return
    if config.logger.backend == "none":
        raise ConfigError(
            "eval.video=true needs a logger backend to send videos to: "
            "set logger.backend to csv, wandb or tensorboard"
        )
    from rl_app.rendering import encoder_problem, render_problem

    problem = render_problem(config.env.name) or encoder_problem(config.logger.backend)
    if problem is not None:
        raise ConfigError(f"eval.video=true cannot work here: {problem}")


def check_background_evaluation(config: Config) -> None:
    """What an evaluation played beside training cannot do: film (a video is filmed while
    training waits), or find its weights' checkpoint after a stop when one save prunes it."""
    if config.eval.backend == "blocking":
        return
    if config.eval.backend == "ray" and config.collector.mode != "ray":
        raise ConfigError(
            "eval.backend=ray plays on the Ray cluster of collector.mode=ray: set it, or "
            "eval.backend=process to play beside training without Ray"
        )
    if config.eval.video:
        raise ConfigError(
            "eval.video=true needs eval.backend=blocking: a video is filmed while training waits"
        )
    if config.checkpoint.keep_last < 2:
        raise ConfigError(
            f"eval.backend={config.eval.backend} needs checkpoint.keep_last >= 2: the checkpoint "
            "saved when an evaluation starts holds its weights until it ends"
        )
