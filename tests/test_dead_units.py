"""The dead-unit reading of tools/dead_units.py: which ReLU units never fire."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tools.dead_units import dead_fractions


def test_units_that_never_fire_are_dead_and_a_channel_is_one_unit() -> None:
    convolution = nn.Conv2d(1, 4, kernel_size=3)
    hidden = nn.Linear(4 * 6 * 6, 10)
    network = nn.Sequential(convolution, nn.ReLU(), nn.Flatten(), hidden, nn.ReLU())
    with torch.no_grad():
        convolution.weight.zero_()
        convolution.bias.copy_(torch.tensor([1.0, -1.0, 1.0, -1.0]))  # 2 channels of 4 off
        hidden.weight.zero_()
        hidden.bias.fill_(-1.0)
        hidden.weight[:3, 0] = 2.0  # 3 units read a live channel: 2 - 1 > 0
    module = TensorDictModule(network, in_keys=["pixels"], out_keys=["features"])
    inputs = TensorDict({"pixels": torch.rand(5, 1, 8, 8)}, batch_size=[5])

    layers, outputs = dead_fractions(module, inputs)

    assert [(units, fraction) for _, units, fraction in layers] == [(4, 0.5), (10, 0.7)]
    assert [name for name, _, _ in layers] == ["1", "4"]
    assert outputs["features"].shape == (5, 10)


def test_a_unit_alive_for_one_input_of_the_batch_is_alive() -> None:
    network = nn.Sequential(nn.Linear(1, 1), nn.ReLU())
    with torch.no_grad():
        network[0].weight.fill_(1.0)
        network[0].bias.zero_()
    module = TensorDictModule(network, in_keys=["x"], out_keys=["y"])
    inputs = TensorDict({"x": torch.tensor([[-3.0], [-1.0], [2.0]])}, batch_size=[3])
    assert dead_fractions(module, inputs)[0] == [("1", 1, 0.0)]
