"""No traceback for any bad input: a seeded, generated fuzz of command lines and preset files.

Each case runs ``train.py``'s ``main`` with ``--print-config`` (so a valid case stops after
validation) in an empty working directory. Every case must end with exit 0 (valid) or exit
2 and one line on stderr naming what is wrong, and a failing case creates no file. Besides
the generated cases, every integer and float key is given magnitudes at and past what
torch, TorchRL and the OS take, on the command line and in a preset file."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import train
from rl_app.config import RunConfig, settings_of

KEYS = [key for key, _, _ in settings_of(RunConfig)]
GROUPS = sorted({key.split(".")[0] for key in KEYS if "." in key})
# env.name values stay among harmless ones: "module:id" imports the module.
ENV_NAMES = ["Pendulum-v1", "CartPole-v1", "NoSuchEnv-v0", "MountainCar-v0", "Pendül-v1", ""]
# Numbers as a user scaling up types them: past int64, past float, past TorchRL's segment
# trees, signed zeros, infinities. An odd count: taken in turn over the keys, each extreme
# is written both ways.
EXTREMES = ["1e99", "-1e99", "1e308", "1e309", str(2**63), str(-(2**63) - 1), str(2**63 - 1),
            str(2**62), str(2**59), "2e9", "-0", "-0.0", "inf", "-inf", ".inf", ".nan",
            "4.9e-324"]  # fmt: skip
NUMBER_KEYS = [
    key for key, item, _ in settings_of(RunConfig)
    if str(item.type).removesuffix("| None").strip() in ("int", "float", "list[int]")
]  # fmt: skip
LIST_KEYS = [key for key, item, _ in settings_of(RunConfig) if str(item.type).startswith("list")]

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
values = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1e4", "2.5e3", "1e-3", "true", "false", "null", "", "[]", "[1, 2]",
                     "[0]", "{a: 1}", "[1, [2]]", "cuda", "cuda:3", "cpu", "auto", "tpu",
                     "prioritized", "uniform", "sync", "async", "distributed", "wandb", "'x"]),
    st.sampled_from(EXTREMES),
    texts,
)  # fmt: skip


def mutate(key: str, draw: st.DrawFn) -> str:
    how = draw(st.sampled_from(["valid", "typo", "deeper", "group", "empty_part"]))
    if how == "typo":
        at = draw(st.integers(0, len(key) - 1))
        return key[:at] + draw(st.sampled_from("xzé_")) + key[at + 1 :]
    if how == "deeper":
        return f"{key}.{draw(st.sampled_from(['x', 'lr', 'name']))}"
    if how == "group":
        return draw(st.sampled_from(GROUPS))
    if how == "empty_part":
        return key.replace(".", "..", 1) if "." in key else f".{key}"
    return key


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        key = mutate(draw(st.sampled_from(KEYS)), draw)
        value = draw(st.sampled_from(ENV_NAMES)) if key == "env.name" else draw(values)
        items.append(f"{key}={value}" if draw(st.booleans()) or not value else key)
    # run_dir and launcher stay put: the fuzz is about reading input, not launching.
    return [item for item in items if not item.startswith(("run_dir", "launcher", "slurm"))]


@st.composite
def preset_texts(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["mapping", "broken", "scalar_group", "list", "raw"]))
    if kind == "broken":
        return draw(st.sampled_from([
            "optim: [1, 2\n", "optim:\n  lr: 1\n lr: 2\n", "a: b: c\n", "\toptim: {}\n",
            "optim: {lr: 1\n", "- [\n", "env:\n  name: 'Pendulum-v1\n", "key: @x\n",
        ]))  # fmt: skip
    if kind == "scalar_group":
        return f"{draw(st.sampled_from(GROUPS))}: {draw(values) or 3}\n"
    if kind == "list":
        return f"{draw(st.sampled_from(GROUPS))}:\n  - 1\n  - 2\n"
    if kind == "raw":
        return draw(texts) + "\n"
    return "".join(as_yaml(*item.partition("=")[::2]) for item in draw(overrides()))


def as_yaml(key: str, value: str) -> str:
    """``key=value`` as the lines of a preset: ``optim.lr=1`` nests ``lr: 1`` in ``optim:``."""
    *groups, leaf = key.split(".")
    return "".join(f"{g}:\n{'  ' * (i + 1)}" for i, g in enumerate(groups)) + f"{leaf}: {value}\n"


def run_main(argv: list[str]) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = train.main(argv)
        except SystemExit as exit:  # argparse's own errors
            code = exit.code
    return code, stderr.getvalue()


# The last test reads what the fuzz tests saw: the module runs in one worker.
pytestmark = pytest.mark.together

# What the fuzz saw: how many cases ran, and each distinct refusal message.
CASES: list[int] = []
MESSAGES: set[str] = set()


def check_case(argv: list[str], workdir: Path) -> None:
    before = sorted(workdir.rglob("*"))
    code, stderr = run_main(["--print-config", *argv])
    CASES.append(code)
    assert code in (0, 2), (argv, code, stderr)
    assert "Traceback" not in stderr, (argv, stderr)
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, stderr)
        MESSAGES.add(lines[0])
        assert sorted(workdir.rglob("*")) == before, argv  # nothing created


@pytest.fixture
def workdir(tmp_path: Path):
    previous = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(previous)


FUZZ = settings(
    max_examples=160, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip


@FUZZ
@given(argv=overrides())
def test_generated_command_lines_exit_0_or_2_with_one_line(workdir: Path, argv: list[str]) -> None:
    check_case(argv, workdir)


@FUZZ
@given(text=preset_texts(), extra=overrides())
def test_generated_preset_files_exit_0_or_2_with_one_line(
    workdir: Path, text: str, extra: list[str]
) -> None:
    preset = workdir.parent / f"{workdir.name}-preset.yaml"  # outside the watched directory
    preset.write_text(text, encoding="utf-8")
    check_case(["--config", str(preset), *extra[:1]], workdir)


def test_extreme_numbers_exit_0_or_2_with_one_line(workdir: Path) -> None:
    """Every number key gets an extreme, the extremes taken in turn, written on the command
    line and in a preset file in turn: each extreme lands on two or three keys, both ways.
    (The generated cases draw extremes too, for random keys.)"""
    preset = workdir.parent / f"{workdir.name}-preset.yaml"  # outside the watched directory
    for index, key in enumerate(NUMBER_KEYS):
        value = EXTREMES[index % len(EXTREMES)]
        value = f"[{value}]" if key in LIST_KEYS else value
        if index % 2:
            preset.write_text(as_yaml(key, value), encoding="utf-8")
            check_case(["--config", str(preset)], workdir)
        else:
            check_case([f"{key}={value}"], workdir)


def test_the_fuzz_saw_many_kinds_of_mistake() -> None:
    """Run after the fuzz tests (file order): they refused inputs for many reasons."""
    print(f"\n{len(CASES)} cases: {CASES.count(0)} valid, {CASES.count(2)} refused with "
          f"{len(MESSAGES)} distinct messages")  # fmt: skip
    assert len(MESSAGES) >= 10, sorted(MESSAGES)
