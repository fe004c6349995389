"""The documents' own rules: measurements live on docs/performance.md, stamped with their commit, date, machine and
command, never in the code's comments, docstrings or messages, nor in the Makefile (a figure there goes stale with no
one to restamp it; the reason stays, `imports vLLM, which is slow`)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from tests.helpers import REPO

PACKAGE = ("cupid", "matcher", "serving", "eval", "training", "scripts")
# A duration: `10 s`, `~10 s`, `31-33 s`, `80 ms`, `3.5 min`, or a clock reading `15:19`.
DURATION = re.compile(
    r"(?<![\w.])~?\d+(?:[.,]\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?\s?(?:ms|s|min|mins|minutes?|seconds?|hours?|h)\b"
    r"|(?<![\w:./])\d{1,2}:\d{2}(?![\d:])"
)
# What a setting says of its duration, where the figure is chosen rather than measured: `polls every 0.2 s`,
# `gives up after 5 s`, `within 10 s`.
SETTING = re.compile(r"\b(?:every|after|within|timeout|interval|at most)\s+$")


def measured_durations(text: str) -> list[tuple[int, str]]:
    """The durations in `text` that are not a setting's, each with its line within `text` (0 for the first)."""
    return [
        (text.count("\n", 0, m.start()), m.group())
        for m in DURATION.finditer(text)
        if not SETTING.search(text[max(0, m.start() - 20) : m.start()])
    ]


def python_texts(path: Path) -> list[tuple[int, str]]:
    """A module's comments and string literals (docstrings and messages), each with its line."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            found.append((tok.start[0], tok.string))
    return found


def durations_in_code(repo: Path) -> list[str]:
    found = []
    for folder in PACKAGE:
        for path in sorted((repo / folder).rglob("*.py")):
            for line, text in python_texts(path):
                found += [f"{path.relative_to(repo)}:{line + i}: {d}" for i, d in measured_durations(text)]
    for number, line in enumerate((repo / "Makefile").read_text().splitlines(), 1):
        found += [f"Makefile:{number}: {d}" for _, d in measured_durations(line)]
    return found


def test_no_package_module_or_makefile_line_states_a_measured_duration():
    assert durations_in_code(REPO) == [], "measurements belong on docs/performance.md, with their stamp"


def test_the_duration_check_finds_a_planted_figure(tmp_path):
    """The check fails on the figures it was written against (each was in the code once), and lets a setting be."""
    for planted in (
        "# Importing vLLM's parser takes ~10 s of a core, so",
        "# a tiny server started in 31-33 s instead of 40",
        "# a third worker on 2 cores made it slower, 15:19 against 14:13",
        "# `gc.collect()` on every call: 80 ms in a test process",
        "# Figures only: ~15 min on 2 cores",
    ):
        assert measured_durations(planted), planted
    assert measured_durations("# polls its health every 0.2 s; vLLM gives up after 5 s") == []
    (tmp_path / "Makefile").write_text("all:\n\ttrue\n")
    for folder in PACKAGE:
        (tmp_path / folder).mkdir()
    (tmp_path / "serving" / "m.py").write_text('"""A module:\nits import takes ~2 s."""\n\nX = 1  # it took 12 s\n')
    assert durations_in_code(tmp_path) == ["serving/m.py:2: ~2 s", "serving/m.py:4: 12 s"]
    (tmp_path / "Makefile").write_text("# the suite: 7:03-8:57 on 2 cores\nall:\n\ttrue\n")
    assert durations_in_code(tmp_path)[2:] == ["Makefile:1: 7:03", "Makefile:1: 8:57"]
