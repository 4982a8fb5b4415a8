"""The docs name only what exists and quote only what is measured: every relative link (and
its heading), ``make`` target, config key and file path that the README and ``docs/`` name;
the figures they quote from a measurement, against the file that records it; and the
commands, lists and defaults they state, against the code."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import statistics
import subprocess
from pathlib import Path

import pytest

from rl_app.checks import load_config
from rl_app.config import RunConfig, available_presets, settings_of
from rl_app.config.loading import changeable_on_resume
from tests.helpers import ROOT
from tools import results

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "slurm" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"^make ([a-z][\w-]*)")
TARGET = re.compile(r"^([a-z][\w-]*):", re.MULTILINE)
# A path in the checkout: a file or folder under one of the project's own folders (a path
# inside a run directory, such as slurm/attempts.jsonl, has no such ending).
PATH = re.compile(
    r"^(?:rl_app|tools|tests|configs|docs|slurm|sweeps|\.ci)/[\w./-]*(?:\.(?:py|md|txt|toml|yaml|sh)|/)$"
)
SETTING = re.compile(r"^[a-z_0-9]+(?:\.[a-z_0-9]+)+$")
FILE_ENDINGS = (".py", ".md", ".txt", ".toml", ".yaml", ".conf", ".json", ".sh")
KEYS = {key for key, _, _ in settings_of(RunConfig)}
GROUPS = {key.rpartition(".")[0] for key in KEYS if "." in key}


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")
    }


def broken_links(text: str, doc: Path) -> list[str]:
    """The relative links of ``text`` (the doc at ``doc``) that reach no file or heading."""
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        reached = (doc.parent / file).resolve() if file else doc
        if not reached.exists():
            broken.append(target)
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            broken.append(target)
    return broken


def unknown_names(text: str) -> list[str]:
    """The ``make`` targets, config keys and checkout paths that ``text``'s code spans name
    (code blocks aside: examples) and that do not exist."""
    targets = set(TARGET.findall((ROOT / "Makefile").read_text()))
    missing = []
    for span in CODE.findall(re.sub(r"```.*?```", "", text, flags=re.DOTALL)):
        if match := MAKE.match(span):
            if match.group(1) not in targets:
                missing.append(span)
            continue
        for word in span.split():
            key = word.split("=", 1)[0]
            if not SETTING.match(key) or key.endswith(FILE_ENDINGS):
                continue  # a call, a file, a wildcard (td3.*)
            if key.rpartition(".")[0] in GROUPS and key not in KEYS:
                missing.append(word)
        if PATH.match(span) and not any(c in span for c in "<*{") and not (ROOT / span).exists():
            missing.append(span)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(doc: Path) -> None:
    broken = broken_links(doc.read_text(), doc)
    assert not broken, f"{doc.name}: links to nothing: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_make_target_config_key_and_path_named_exists(doc: Path) -> None:
    missing = unknown_names(doc.read_text())
    assert not missing, f"{doc.name} names what does not exist: {missing}"


def test_the_docs_check_finds_what_it_looks_for() -> None:
    text = """
`make train` `make trian` `replay.capacity=10` `replay.capacty=10` `td3.*` `env.reset()`
`rl_app/loop.py` `rl_app/lop.py` `tools/bench/` `<run_dir>/slurm/collectors/`
[speed](docs/speed.md#settings-for-speed) [gone](docs/none.md) [no heading](README.md#nowhere)
```
make nothing-here
```
"""
    assert unknown_names(text) == ["make trian", "replay.capacty=10", "rl_app/lop.py"]
    assert broken_links(text, ROOT / "README.md") == ["docs/none.md", "README.md#nowhere"]


def section(path: Path, start: str, end: str = "\n\n") -> str:
    """The text of ``path`` from ``start`` (which must be there) to the next ``end``."""
    text = path.read_text()
    assert start in text, f"{path.name} no longer says {start!r}"
    return text.split(start, 1)[1].split(end, 1)[0]


def named_keys(text: str) -> set[str]:
    """The settings ``text``'s code spans name, a ``group.*`` span standing for its group."""
    named = set()
    for span in CODE.findall(text):
        if span in KEYS:
            named.add(span)
        elif span.endswith(".*") and span[:-2] in GROUPS:
            named |= {key for key in KEYS if key.startswith(span[:-1])}
    return named


@pytest.mark.parametrize(
    ("doc", "start", "end"),
    [("README.md", "On resume only these keys may change:", "any other change"),
     ("docs/reliability.md", "On resume these keys may change:", "Any other change")],
)  # fmt: skip
def test_the_keys_a_resume_may_change_are_the_ones_the_docs_list(
    doc: str, start: str, end: str
) -> None:
    named = named_keys(section(ROOT / doc, start, end))
    changeable = set(changeable_on_resume(RunConfig))
    assert named == changeable, (
        f"{doc}: resumable but not named: {sorted(changeable - named)}; "
        f"named but refused on resume: {sorted(named - changeable)}"
    )


def test_make_help_lists_every_target_the_readme_names() -> None:
    shown = subprocess.run(
        ["make", "--no-print-directory", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = {line.split()[1] for line in shown.splitlines()}
    spans = CODE.findall((ROOT / "README.md").read_text())
    named = {match.group(1) for span in spans if (match := MAKE.match(span))}
    assert named and named <= listed, f"make help does not list {sorted(named - listed)}"


# -- figures quoted from a measurement ---------------------------------------------------------


def test_the_readme_results_table_is_what_make_results_writes() -> None:
    written = results.results_table()
    shown = results.readme_table((ROOT / "README.md").read_text())
    assert shown == written, (
        "the README's results table differs from docs/results.json, docs/results-atari.json "
        "and docs/random_policy.json: python -m tools.results --table-only rewrites it"
    )


def test_make_results_measures_the_readme_tables_rows_over_the_seeds_it_shows() -> None:
    names = results.entry_names()
    rows = [name for row in results.TABLE for name in row.entries]
    assert set(rows) <= set(names), f"table rows of no entry: {set(rows) - set(names)}"
    measured = [name for row in results.TABLE if not row.not_run for name in row.entries]
    assert results.parse_args([]).entries == measured == results.DEFAULT_ENTRIES
    stored = {
        **results.stored_summaries(ROOT / results.STORE),
        **results.stored_summaries(ROOT / results.ATARI_STORE),
    }
    # Every stored summary is shown, and shown with the seeds the tool would run again.
    assert set(stored) <= set(rows), f"stored, not in the table: {set(stored) - set(rows)}"
    for name in measured:
        if name in stored:
            assert len(stored[name].runs) == len(results.entry_seeds(name, None)), name


def test_make_results_names_the_committed_files_it_rewrites_before_it_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.chdir(ROOT)
    rewritten = ["docs/results.json", "docs/results.png", "README.md (its results table)"]
    assert results.rewritten_files(results.parse_args([])) == rewritten
    random_policy = results.parse_args(["--random-policy"])
    assert results.rewritten_files(random_policy) == [
        "docs/random_policy.json", "README.md (its results table)"
    ]  # fmt: skip
    shown = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    (line,) = [line for line in shown.splitlines() if line.split()[1] == "results"]
    assert all(name.split()[0] in line for name in rewritten), line

    # Elsewhere, what exists there; said before the first run's settings are checked.
    store = tmp_path / "results.json"
    store.write_text("{}")
    monkeypatch.setitem(results.ENTRIES, "refused", ("default", ["optim.lr=-1"]))
    args = ["--entries", "refused", "--seeds", "1", "--store", str(store)]
    assert results.main([*args, "--root", str(tmp_path / "runs")]) == 2
    out, err = capsys.readouterr()
    assert out == f"this rewrites {store} when it ends: review them with git diff\n"
    assert err.startswith("error: optim.lr=-1") and store.read_text() == "{}"


def quoted_scores(pattern: str) -> list[tuple[str, str]]:
    """(doc, figure) for every match of ``pattern`` (one group: the figure) in the docs."""
    return [
        (doc.name, figure)
        for doc in DOCS
        for figure in re.findall(pattern, doc.read_text().replace("\n", " "))
    ]


def agrees(quoted: str, measured: float) -> bool:
    """Whether ``quoted`` is ``measured`` rounded to the last digit it shows (``-1,250``:
    tens; ``20``: tens; ``0.6``: tenths)."""
    number = quoted.replace(",", "")
    if "." in number:
        digits = -len(number.split(".")[1])
    else:
        digits = len(number) - len(number.rstrip("0")) if number.strip("-0") else 0
    return float(number) == round(measured, -digits)


@pytest.mark.parametrize(
    ("entry", "pattern", "at_least"),
    [("default", r"random policy scores about (-[\d,]+)", 3),
     ("dqn_cartpole", r"random policy scores about [-\d,]+ on \w+ and about (\d+) on CartPole", 1)],
)  # fmt: skip
def test_a_random_policys_score_is_quoted_as_measured(
    entry: str, pattern: str, at_least: int
) -> None:
    stored = json.loads((ROOT / results.RANDOM_STORE).read_text())[entry]["eval_returns"]
    measured = statistics.mean(stored)
    quotes = quoted_scores(pattern)
    assert len(quotes) >= at_least, f"fewer quotes than the docs hold: {quotes}"
    wrong = [(doc, figure) for doc, figure in quotes if not agrees(figure, measured)]
    assert not wrong, f"{results.RANDOM_STORE} records {measured:.1f} for {entry}: {wrong}"


def test_a_quoted_figure_agrees_to_the_digits_it_shows() -> None:
    assert agrees("-1,250", -1248.1) and agrees("-1,200", -1248.1) and agrees("20", 21.5)
    assert not agrees("-1,460", -1248.1) and not agrees("-1,248", -1248.6)
    assert agrees("0.6", 0.57) and agrees("0", 0.2) and not agrees("1.3", 1.21)


def test_docs_speed_md_quotes_what_docs_bench_json_records() -> None:
    bench = json.loads((ROOT / "docs" / "bench.json").read_text())
    medians = bench["sb3"]["medians"]
    training, sampling = bench["training"], bench["pixels"]["sampling"]
    quoted = [
        f"**{medians['rl_app']['wall_seconds']:.1f} s (ours) vs "
        f"{medians['stable-baselines3']['wall_seconds']:.1f} s (SB3)**",
        f"**{bench['sb3']['wall_time_ratio_ours_to_sb3']:.2f}x** SB3's time",
        f"{training['frames_per_second']:.1f} environment frames/s; one update step "
        f"{training['ms_per_update_step']:.1f} ms",
        f"**{sampling['with_stacks_batches_per_second']:,.0f} batches/s**",
        f"**{sampling['to_torchrl']:.1f}x**",
    ]
    text = (ROOT / "docs" / "speed.md").read_text().replace("\n", " ")
    missing = [figure for figure in quoted if figure not in text]
    assert not missing, f"docs/speed.md does not quote docs/bench.json's {missing}"


DURATION = re.compile(r"\b\d[\d,.]*\s*(?:min|minutes|h|hours|s|seconds)\b|\d+ passed")


def test_only_docs_testing_md_quotes_how_long_the_suite_takes() -> None:
    readme = (ROOT / "README.md").read_text()
    tests = readme.split("## Tests", 1)[1].split("\n## ", 1)[0]
    commands = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    makefile = [
        line for line in (ROOT / "Makefile").read_text().splitlines() if "test" in line.lower()
    ]
    quoted = DURATION.findall(tests + commands + "\n".join(makefile))
    assert not quoted, f"the suite's time or count outside docs/testing.md: {quoted}"
    durations = re.search(r"--durations=(\d+)", (ROOT / "Makefile").read_text()).group(1)
    assert f"lists its {durations} slowest tests" in tests.replace("\n", " ")


# -- lists, commands and defaults ----------------------------------------------------------


def test_the_presets_that_compile_are_those_docs_speed_md_lists() -> None:
    listed = section(ROOT / "docs" / "speed.md", "- `optim.compile` (on in the", "presets")
    compiled = [preset for preset in available_presets() if load_config(preset).optim.compile]
    assert sorted(CODE.findall(listed)) == compiled


def doc_commands(doc: Path) -> list[str]:
    """The ``train.py`` commands of ``doc``'s code blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", doc.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if re.match(r"(?:\.venv/bin/)?python train\.py ", line):
                commands.append(line.split(" #", 1)[0].strip())
    return commands


# Commands that need what a test cannot have: a Ray cluster at an address, a shell variable.
NEEDS_MORE = ("ray.address=", "$", "--help")
# The profile the docs' `my-cluster` stands for: a copy of the shipped template.
PROFILE_STANDS_FOR = {"my-cluster": "example-gpu-cluster"}


def check_command(command: str) -> None:
    """What ``train.py`` checks of ``command`` before it trains or submits: its config
    (``--print-config``), and a SLURM job's settings and Ray allocation."""
    from rl_app.launch.cluster import collection_job_settings, job_settings
    from rl_app.launch.slurm import check_job_ray

    words = shlex.split(command)[2:]
    preset = words[words.index("--config") + 1] if "--config" in words else "default"
    overrides = [word for word in words if "=" in word]
    config = load_config(preset, overrides)
    profile = PROFILE_STANDS_FOR.get(config.slurm.profile, config.slurm.profile)
    slurm = dataclasses.replace(config.slurm, profile=profile)
    if config.launcher == "slurm":
        settings = job_settings(slurm)
        check_job_ray(config, settings)
        # slurm/profiles/local.yaml is the one-node test cluster.
        assert settings.nodes == 1 or profile != "local", f"{command}: one node only"
    if config.collector.mode == "distributed" or config.rpc.launcher == "slurm":
        collection_job_settings(slurm)  # what is checked before the cluster is asked


@pytest.mark.parametrize(
    "doc", [ROOT / "README.md", ROOT / "docs" / "scale-out.md"], ids=lambda path: path.name
)
def test_the_docs_train_commands_are_accepted(doc: Path) -> None:
    commands = [c for c in doc_commands(doc) if not any(part in c for part in NEEDS_MORE)]
    assert commands
    for command in commands:
        check_command(command)


def documented_keys() -> set[str]:
    """The settings the docs name (slurm/README.md's profile table by their profile name)."""
    text = "".join(doc.read_text() for doc in DOCS)
    named = {word.split("=", 1)[0] for span in CODE.findall(text) for word in span.split()}
    profile = section(ROOT / "slurm" / "README.md", "| key | sbatch | default |")
    return named | {f"slurm.{key}" for key in CODE.findall(profile)}


def test_every_setting_is_named_in_a_doc() -> None:
    undocumented = sorted(KEYS - documented_keys())
    assert not undocumented, f"no doc names {undocumented} (train.py --help lists every key)"


def test_every_sweep_file_key_is_named_in_docs_sweeps_md() -> None:
    from rl_app.sweep.spec import SweepSettings

    text = (ROOT / "docs" / "sweeps.md").read_text()
    named = set(re.findall(r"^(\w+):", text, flags=re.MULTILINE)) | set(CODE.findall(text))
    keys = {field.name for field in dataclasses.fields(SweepSettings)} | {"overrides", "space"}
    assert keys <= named, f"docs/sweeps.md does not name {sorted(keys - named)}"


def makefile_targets_using(variable: str) -> set[str]:
    """The Makefile targets whose recipe passes ``$(variable)``."""
    targets, target = set(), None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if match := TARGET.match(line):
            target = match.group(1)
        elif line.startswith("\t") and f"$({variable})" in line and target:
            targets.add(target)
    return targets


def test_the_readme_says_which_targets_take_args_and_pytest_args() -> None:
    (row,) = [
        line for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith('| `ARGS="..."` |')
    ]  # fmt: skip
    args_part, pytest_part = row.split('`PYTEST_ARGS="..."`')
    args_part, excluded = args_part.split(", e.g.")[0], args_part.split(", e.g.")[1]
    targets = set(TARGET.findall((ROOT / "Makefile").read_text()))
    named = {span for span in CODE.findall(args_part) if span in targets}
    assert named == makefile_targets_using("ARGS")
    not_taking = {span for span in CODE.findall(excluded) if span in targets}
    assert not_taking and not not_taking & makefile_targets_using("ARGS")
    assert set(CODE.findall(pytest_part)) == makefile_targets_using("PYTEST_ARGS")
