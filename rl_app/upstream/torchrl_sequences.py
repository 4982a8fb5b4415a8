"""TorchRL 0.14.1's ``LSTMModule``: the workaround of what it writes when a loss unrolls it
over sequences (the index is in :mod:`rl_app.upstream`). Imported only by
:mod:`rl_app.algorithms.dqn`, for recurrent networks."""

from __future__ import annotations

from tensordict.nn import TensorDictSequential
from torchrl.modules import LSTMModule

# -- 1. an LSTM unrolled over sequences ----------------------------------------------------


def unrolling_view(network: TensorDictSequential) -> TensorDictSequential:
    """``network`` as a loss unrolls it over ``[sequences, steps]``: the same modules and
    weights, but its LSTM writes the states it reaches under keys of its own.

    In recurrent mode TorchRL's ``LSTMModule`` writes the state it reached only at the
    last step, zeros before it, under its out_keys ``("next", state key)``: inside a loss
    those would replace the stored next states that the next states' values unroll from
    (``DQNLoss`` takes its next states from the same tensordict). Acting one step at a time,
    the policy still writes ``("next", state key)``, which the env carries to the next step.
    Test: ``test_an_unrolled_lstm_still_writes_zeros_before_the_last_step``."""
    modules = []
    for module in network:
        if isinstance(module, LSTMModule):
            states = [key if isinstance(key, str) else key[-1] for key in module.in_keys[1:3]]
            module = LSTMModule(
                lstm=module.lstm,
                in_keys=module.in_keys[:3],
                out_keys=[module.out_keys[0], *(f"unrolled_{key}" for key in states)],
            )
        modules.append(module)
    return TensorDictSequential(*modules)
