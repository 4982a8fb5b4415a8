"""torch 2.14.1: how inductor splits a compiled loss into forward and backward (private
``torch._functorch`` and ``torch._inductor`` names), its CUDA_HOME warning on machines
without CUDA, and FLOPs counted as they run (the index is in :mod:`rl_app.upstream`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

# -- 1. how inductor splits a compiled loss ------------------------------------------------


class SaveAsEagerDoes(CustomPartitionerFn):
    """Split a compiled loss into forward and backward graphs as eager autograd does: the
    backward reads the float activations the forward saved.

    Inductor's own split saves a ``bool`` mask per ReLU instead (a quarter of the memory),
    and its generated C++ for CPUs converts and stores such masks through a slow scalar
    path, slower than eager autograd's split on the CPUs measured (docs/speed.md,
    ``make bench ARGS="--only update"``).
    Tests: ``test_inductor_still_saves_bool_masks_for_relu_backward``, and
    ``tests/test_compile.py`` (compiled and eager updates take the same steps)."""

    def __call__(
        self, gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        # Imported here, where a compile runs anyway, rather than by every process.
        from torch._functorch.partitioners import default_partition

        kwargs.pop("compiler", None)  # inductor names itself; this split takes no name
        return default_partition(gm, joint_inputs, **kwargs)

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


# inductor options of a loss compiled with that split. In-place buffer reuse must be off:
# with it on, a saved activation was overwritten before the backward read it (the last
# Q-layer's weight gradient of SAC came out wrong). Test:
# ``test_the_eager_split_still_needs_inplace_buffers_off``.
EAGER_SPLIT = {"custom_partitioner_fn": SaveAsEagerDoes(), "inplace_buffers": False}


# -- 2. a CUDA warning on machines without CUDA ---------------------------------------------

# The logger of torch.utils.cpp_extension, which a compile imports.
CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"


def quiet_cuda_home_warning() -> None:
    """On a machine without a CUDA runtime, keep torch's C++-extension module from logging
    "No CUDA runtime is found, using CUDA_HOME=..." when a compile first imports it: a
    CPU run needs no CUDA, and the line reads like a fault. Raised to errors only where
    CUDA is absent, so a GPU machine still logs its own warnings. Test:
    ``test_torch_still_warns_about_cuda_home_without_cuda``."""
    if not torch.cuda.is_available():
        logging.getLogger(CPP_EXTENSION_LOGGER).setLevel(logging.ERROR)


# -- 3. FLOPs counted as they run ---------------------------------------------------------


class MatmulFlops(TorchDispatchMode):
    """Counts the FLOPs of every matrix product that runs inside it (torch's own formulas
    per operator: ``mm``, ``addmm``, ``bmm``, ...), whatever the code around them (vmap
    batches products into ``bmm``; a loop runs them one by one). ``make bench`` counts an
    update's FLOPs with it.

    torch's public ``FlopCounterMode`` counts with the same formulas but also tracks the
    modules that run, and that fails on a module holding tensordict's ``TensorDictParams``
    (as every TorchRL loss does): it looks modules up in a weak dictionary, whose key
    comparison turns a tensordict into a bool. This counter keeps only the count, through
    torch's private ``torch.utils._python_dispatch`` and an operator's ``_overloadpacket``.
    Test: ``test_flop_counter_mode_still_fails_on_a_module_holding_tensordict_params``."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.flops += count(*args, **kwargs, out_val=out)
        return out
