"""The package's import graph: no cycle, every arrow pointing down, the core apart from
scale-out, and the tools apart from the trainer."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rl_app.config import Config
from rl_app.run import train
from tests.helpers import PYTHON, ROOT, TINY_RUN

PACKAGE = ROOT / "rl_app"
# Scale-out: worker processes, collection jobs, Ray actors and the SLURM launcher.
SCALE = (
    "rl_app.collection.workers", "rl_app.collection.distributed", "rl_app.collection.ray",
    "rl_app.collection.rpc", "rl_app.launch", "rl_app.upstream.ray",
    "rl_app.upstream.torchrl_workers", "rl_app.upstream.torchrl_collectors",
    "rl_app.ray_evaluation",
)  # fmt: skip
# The places the core hands work to scale-out code, importing it only when asked to: a
# collection mode to its backend, evaluations to a Ray actor, and a sweep with
# ``launcher: slurm`` to the SLURM launcher.
DOORS = (
    ("rl_app.collection", "make_collector"), ("rl_app.loop", "background_evaluator"),
    ("rl_app.sweep.worker", "submit_to_slurm"),
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> list[tuple[str, str | None]]:
    """(imported rl_app module, enclosing function or None at module level) of every import
    in ``path``, wherever it is written."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef) else function
            if isinstance(child, ast.ImportFrom) and child.module:
                for alias in child.names:
                    submodule = f"{child.module}.{alias.name}"
                    target = submodule if submodule in known else child.module
                    if target in known:
                        found.append((target, function))
            elif isinstance(child, ast.Import):
                found.extend((a.name, function) for a in child.names if a.name in known)
            visit(child, inner)

    visit(ast.parse(path.read_text()), None)
    return found


def plugin_files() -> list[str]:
    """The files of every optional feature, as the README's "Forking it" lists them."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| feature | its files | chosen by |") :].split("\n\n")[0]
    rows = table.splitlines()[2:]
    return [path for row in rows for path in re.findall(r"`([^`]+)`", row.split("|")[2])]


def plugin_modules() -> set[str]:
    modules = package_modules()
    files = [ROOT / path for path in plugin_files()]
    return {
        name
        for name, path in modules.items()
        if any(path == file or file in path.parents for file in files)
    }


def import_graph() -> dict[str, set[str]]:
    """Who imports whom; the core's imports of a plug-in inside a function (run where a
    setting chooses it, after every module-level import) are not arrows of the graph."""
    modules, plugins = package_modules(), plugin_modules()
    return {
        name: {
            target
            for target, function in imports_of(path, set(modules))
            if not (function and target in plugins and name not in plugins)
        }
        - {name}
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules, or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_package_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_the_cycle_check_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_core_imports_a_plugin_only_inside_the_function_that_chooses_it() -> None:
    modules, plugins = package_modules(), plugin_modules()
    assert len(plugins) >= len(plugin_files())  # every file the README names exists
    for name, path in modules.items():
        if name in plugins:
            continue
        for target, function in imports_of(path, set(modules)):
            assert function or target not in plugins, f"{name} imports {target} at its top"


def test_deleting_every_plugin_leaves_a_core_that_trains_the_default_preset(
    tmp_path: Path,
) -> None:
    for part in ("rl_app", "configs"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "train.py", tmp_path)
    for path in plugin_files():
        shutil.rmtree(tmp_path / path) if (tmp_path / path).is_dir() else (tmp_path / path).unlink()
    tiny = [arg for arg in TINY_RUN if not arg.startswith("eval.")]
    run_dir = f"run_dir={tmp_path / 'run'}"

    def train(*args: str) -> subprocess.CompletedProcess:  # the copy's own train.py
        command = [PYTHON, str(tmp_path / "train.py"), *args]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    trained = train(*tiny, "eval.interval_frames=1200", "eval.episodes=1", run_dir)
    assert trained.returncode == 0, trained.stderr
    assert "best eval return" in trained.stdout
    helped = train("--help")
    assert "algo=sac  (sac (continuous actions))" in helped.stdout, helped.stderr


def files_each_iteration_enters(config: Config) -> list[set[str]]:
    """Train ``config`` in this process and return, per iteration of the loop, the
    ``rl_app`` files outside ``upstream/`` whose code ran in it (an iteration starts where
    the loop enters its "collecting" phase)."""
    per_iteration: list[set[str]] = [set()]
    package, upstream = str(PACKAGE), str(PACKAGE / "upstream")
    collecting: list[FrameType] = []  # the phase's frame, entered again when it ends

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if frame.f_code.co_name == "__call__" and frame.f_locals.get("phase") == "collecting":
            if frame not in collecting:
                collecting[:] = [frame]
                per_iteration.append(set())
        if path.startswith(package) and not path.startswith(upstream):
            per_iteration[-1].add(Path(path).relative_to(ROOT).as_posix())

    sys.setprofile(profile)
    try:
        train(config)
    finally:
        sys.setprofile(None)
    return per_iteration[1:]


def test_one_default_iteration_enters_the_files_the_readme_tour_names(
    tiny_config: Callable[..., Config],
) -> None:
    # Iteration 3 of 6: it updates (from 400 frames on), and neither evaluates nor saves.
    config = tiny_config("eval.interval_frames=1000")
    entered = files_each_iteration_enters(config)[2]
    tour = (ROOT / "README.md").read_text().split("## A tour of the package")[1]
    listed = re.findall(r"^- `(rl_app/[\w/]+\.py)`", tour.split("\n\n|")[0], re.MULTILINE)
    assert entered == set(listed), f"one iteration entered {sorted(entered)}"
    assert "rl_app/algorithms/sac.py" in entered and "rl_app/run.py" not in entered


def test_the_core_imports_no_scale_out_module_but_through_its_doors() -> None:
    modules = package_modules()
    for name, path in modules.items():
        if name.startswith(SCALE):
            continue
        for target, function in imports_of(path, set(modules)):
            if target.startswith(SCALE):
                assert (name, function) in DOORS, f"{name} imports {target} in {function}"


def test_the_loop_knows_no_algorithm_and_the_trainer_no_tool() -> None:
    graph = import_graph()
    assert "rl_app.algorithms" in graph["rl_app.loop"]
    assert not {"rl_app.algorithms.sac", "rl_app.algorithms.dqn"} & graph["rl_app.loop"]
    for path in PACKAGE.rglob("*.py"):
        assert "from tools" not in path.read_text(), path


# What tools take from the loop: the types of what rl_app.run's train and build_run return
# and of the fault train raises, and its rule for the updates each batch gets; never its
# steps, nor its phase names.
TOOLS_FROM_THE_LOOP = {"Run", "TrainResult", "RunFailed", "updates_per_iteration"}


def test_tools_take_from_the_loop_only_what_it_offers_them() -> None:
    for path in (ROOT / "tools").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "rl_app.loop":
                names = {alias.name for alias in node.names}
                assert names <= TOOLS_FROM_THE_LOOP, f"{path}: {names - TOOLS_FROM_THE_LOOP}"


def test_the_config_package_imports_no_owner() -> None:
    """The schema and its loading sit on the ground floor: algorithms, envs, replay and
    collection bring their settings and checks to it, never the other way round."""
    owners = ("rl_app.algorithms", "rl_app.envs", "rl_app.replay", "rl_app.collection")
    program = f"""
import sys
import rl_app.config
print(sorted(m for m in sys.modules if m.startswith({owners!r}) or m == "gymnasium"))
"""
    result = subprocess.run(
        [PYTHON, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_direct_run_loads_no_scale_out_module(tmp_path: Path) -> None:
    program = f"""
import sys, torch
from rl_app.algorithms import make_algorithm
from rl_app.collection import decide_devices, make_collector
from rl_app.checks import load_config
from rl_app.envs import make_env
from rl_app import loop
config = load_config("default", ["run_dir={tmp_path / "run"}", "network.hidden_sizes=[8]"])
algorithm = make_algorithm(config, make_env(config.env, 0), torch.device("cpu"))
make_collector(config, algorithm, decide_devices(config)).shutdown()
print(sorted(m for m in sys.modules if m.startswith({SCALE!r})))
"""
    result = subprocess.run(
        [PYTHON, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# -- private names of dependencies ----------------------------------------------------------

OWN_PACKAGES = ("rl_app", "tools", "tests")
UPSTREAM = PACKAGE / "upstream"
# Files besides rl_app/upstream/ that may reach a dependency's private names, and why.
PRIVATE_NAMES_ALLOWED = {
    "tests/test_upstream.py": "checks the private names rl_app/upstream/ relies on",
    "tests/test_extension.py": "checks that TorchRL's compiled extension (torchrl._torchrl) loads",
    "tests/test_stops.py": "sends a signal from inside inspect.getfullargspec's own try block "
    "(its private _signature_from_callable), where a stop once failed a run",
}
# Names that start with an underscore and are public all the same, documented as such:
# os._exit, and a namedtuple's methods.
DOCUMENTED_PUBLIC = {"_exit", "_asdict", "_replace", "_fields", "_make"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def python_files() -> list[Path]:
    return sorted(path for top in OWN_PACKAGES for path in (ROOT / top).rglob("*.py"))


def own_private_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Private names the project defines outside rl_app/upstream/: module-level and
    class-level names, and attributes assigned on ``self`` or ``cls``."""
    names = set()
    for path, tree in trees.items():
        if path.is_relative_to(UPSTREAM):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return {name for name in names if is_private(name)}


def private_reaches(tree: ast.Module, own: set[str]) -> list[str]:
    """Where ``tree`` imports a private module or name of a dependency, or reaches a private
    attribute the project does not define, one ``line: what`` each."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in OWN_PACKAGES:
                continue
            names = [*node.module.split("."), *(alias.name for alias in node.names)]
            if any(is_private(name) for name in names):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(is_private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and node.attr not in own | DOCUMENTED_PUBLIC
        ):
            found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_only_rl_app_upstream_reaches_private_names_of_dependencies() -> None:
    trees = {path: ast.parse(path.read_text()) for path in python_files()}
    own = own_private_names(trees)
    reached = {}
    for path, tree in trees.items():
        name = str(path.relative_to(ROOT))
        if path.is_relative_to(UPSTREAM) or name in PRIVATE_NAMES_ALLOWED:
            continue
        if found := private_reaches(tree, own):
            reached[name] = found
    assert not reached, f"private names of dependencies outside rl_app/upstream/: {reached}"


def test_the_private_name_check_finds_what_it_looks_for() -> None:
    source = """
from torch._inductor import config
from _pytest.nodeid import coerce_node_id
import torch._dynamo
from optuna.trial import _state
frozen._trial_id
getattr(buffer, "_rng")
self._mine
buffer.__len__()
"""
    found = private_reaches(ast.parse(source), own={"_mine"})
    assert [line.split(":")[0] for line in found] == ["2", "3", "4", "5", "6", "7"], found
