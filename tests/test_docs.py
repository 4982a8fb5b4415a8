"""The docs name only what exists: every relative link (and its heading), ``make`` target,
config key and file path that the README and ``docs/`` name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rl_app.algorithms import RunConfig
from rl_app.config.loading import changeable_on_resume, settings_of
from tests.helpers import ROOT

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


def test_the_keys_a_resume_may_change_are_all_named_in_the_reliability_doc() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    listed = text.split("On resume these keys may change:", 1)[1].split("\n\n", 1)[0]
    named = set(CODE.findall(listed))
    unnamed = [
        key
        for key in changeable_on_resume(RunConfig)
        if key not in named and f"{key.partition('.')[0]}.*" not in named
    ]
    assert not unnamed, f"docs/reliability.md does not name these resumable keys: {unnamed}"


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
