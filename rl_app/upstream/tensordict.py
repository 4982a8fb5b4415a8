"""tensordict 0.14.3: recompiles caused by its class memo, a search for pandas on every
module output, and a deprecation warning it triggers (the index is in :mod:`rl_app.upstream`)."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Sequence
from typing import Any

# -- 1. recompiles of a compiled loss ------------------------------------------------------

TENSORCLASS_MEMO = "_TENSORCLASS_MEMO"


def without_tensorclass_memo_guards(guards: Sequence[Any]) -> list[bool]:
    """A ``guard_filter_fn`` for ``torch.compile``: keep every guard but those on the length
    of tensordict's private ``tensordict.utils._TENSORCLASS_MEMO``.

    tensordict caches per class whether it is a tensorclass; a compiled loss reads that
    cache, so dynamo guards on its length, and a class checked anywhere else in the process
    for the first time recompiles the loss. The first evaluation's weight copy checks
    ``str``: a recompile in every compiled run (docs/speed.md). The cache holds a fixed fact per
    class, so its length decides nothing the compiled code does. Test:
    ``test_a_compiled_loss_still_guards_on_tensordicts_class_memo``."""
    return [TENSORCLASS_MEMO not in guard.name for guard in guards]


# -- 2. a search for pandas on every module output -----------------------------------------


def skip_pandas_lookups() -> None:
    """Where pandas is not installed, record it in ``sys.modules`` as absent.

    tensordict 0.14.3 writes every output of a ``TensorDictModule`` through
    ``TensorDict.from_any``, which calls ``importlib.util.find_spec("pandas")``: a search of
    every ``sys.path`` entry for each policy call while collecting or evaluating, and each
    module call of an eager update (its cost: docs/speed.md). Recorded as absent, the
    look-up answers at once, and ``import pandas`` raises ``ModuleNotFoundError`` as
    before. Test:
    ``test_tensordict_still_looks_for_pandas_on_every_module_output``."""
    if "pandas" not in sys.modules and importlib.util.find_spec("pandas") is None:
        sys.modules["pandas"] = None


# -- 3. a deprecation warning from every compiled loss --------------------------------------

# torch deprecated this dynamo setting (it is always on); tensordict still reads it whenever a
# compiled module calls ``to_module``, and the read warns.
INLINE_MODULES_WARNING = r".*inline_inbuilt_nn_modules"


def ignore_inline_modules_deprecation() -> None:
    """Silence the ``FutureWarning`` tensordict 0.14.3 triggers in every compiled run by
    reading ``torch._dynamo.config.inline_inbuilt_nn_modules``, which tells a user nothing
    they can act on. Test: ``test_tensordict_still_reads_the_deprecated_inline_setting``."""
    warnings.filterwarnings("ignore", message=INLINE_MODULES_WARNING, category=FutureWarning)
