"""``python -m tools.dead_units RUN_DIR [--checkpoint last|best|PATH] [--steps N]``: how
much of a run's policy network has died.

A ReLU unit that outputs zero for every input gets no gradient and never comes back; a
network whose last hidden layer has died outputs the same values whatever it sees. This
plays ``--steps`` random actions in the run's evaluation env, runs the checkpoint's policy
on every observation, and prints each ReLU layer's fraction of units that were zero on all
of them (a convolution's unit is a channel) and, for a Q-network, how much its Q-values
vary across those observations: near zero, the agent acts the same everywhere
(docs/atari.md, "Dead units").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.envs import EnvBase

from rl_app.evaluation import evaluation_env
from rl_app.play import PlayError, load_policy, run_config


def dead_fractions(
    module: nn.Module, inputs: TensorDictBase
) -> tuple[list[tuple[str, int, float]], TensorDictBase]:
    """Run ``module`` once on the batch ``inputs``; return, for each of its ReLU layers in
    order, its name (the module path without TensorDict wrappers), its number of units and
    the fraction of them that output zero for every input; and what ``module`` returned."""
    layers: list[tuple[str, int, float]] = []

    def record(name: str, output: torch.Tensor) -> None:
        # [batch, units] or [batch, channels, height, width]: a channel is one unit.
        alive = output.reshape(*output.shape[:2], -1).gt(0).any(-1).any(0)
        units = alive.numel()
        layers.append((name.replace("module.", ""), units, (units - alive.sum().item()) / units))

    hooks = [
        layer.register_forward_hook(lambda _, __, out, name=name: record(name, out))
        for name, layer in module.named_modules()
        if isinstance(layer, nn.ReLU)
    ]
    try:
        with torch.no_grad():
            outputs = module(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return layers, outputs


def random_play_observations(env: EnvBase, steps: int) -> TensorDictBase:
    """The observations of ``steps`` random actions in ``env``, stacked."""
    observations = []
    state = env.reset()
    for _ in range(steps):
        state = env.step(env.rand_action(state))["next"]
        observations.append(state.exclude("next").clone())
        if state["done"].any():
            state = env.reset()
    return torch.stack(observations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default="last", help="last | best | a checkpoint path")
    parser.add_argument("--steps", type=int, default=300, help="random-play observations")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps} is out of range: it must be > 0")
    torch.manual_seed(0)
    try:
        policy = load_policy(args.run_dir, args.checkpoint)
        env = evaluation_env(run_config(Path(args.run_dir)))
    except PlayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    layers, outputs = dead_fractions(policy, random_play_observations(env, args.steps))
    for name, units, fraction in layers:
        print(f"ReLU {name} ({units} units): {fraction:.0%} dead")
    if "action_value" in outputs.keys():  # a Q-network
        spread = outputs["action_value"].std(0).mean().item()
        print(f"Q-values: standard deviation across observations {spread:.4f} (mean over actions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
