"""The documents' own rules: measurements live on docs/performance.md, stamped with their commit, date, machine and
command, never in the code's comments, docstrings or messages, nor in the Makefile or the configs' comments (a figure
there goes stale with no one to restamp it; the reason stays, `imports vLLM, which is slow`)."""

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
    for path in sorted((repo / "configs").rglob("*.yaml")):  # a config's comments say what a setting does
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "#" in line:
                comment = line[line.index("#") :]
                found += [f"{path.relative_to(repo)}:{number}: {d}" for _, d in measured_durations(comment)]
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
    for folder in (*PACKAGE, "configs/serve"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "serving" / "m.py").write_text('"""A module:\nits import takes ~2 s."""\n\nX = 1  # it took 12 s\n')
    assert durations_in_code(tmp_path) == ["serving/m.py:2: ~2 s", "serving/m.py:4: 12 s"]
    (tmp_path / "Makefile").write_text("# the suite: 7:03-8:57 on 2 cores\nall:\n\ttrue\n")
    assert durations_in_code(tmp_path)[2:] == ["Makefile:1: 7:03", "Makefile:1: 8:57"]
    (tmp_path / "configs/serve/p.yaml").write_text(
        "startup_timeout_s: 600   # gives up after 600 s\nvllm:\n  enforce_eager: true  # starts in ~35 s on 2 cores\n"
    )
    assert durations_in_code(tmp_path)[4:] == ["configs/serve/p.yaml:3: ~35 s"]


def _references():
    """scripts/docs_reference.py, as a module (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_field_and_command_has_its_line_of_help():
    assert _references().problems() == []


def test_the_committed_references_are_what_the_code_writes():
    """A field, an option or a command added, renamed or redescribed without `python scripts/docs_reference.py`
    (`make docs`) fails here, naming the page."""
    stale = [str(path) for path, text in _references().pages().items() if (REPO / path).read_text() != text]
    assert stale == [], "run `python scripts/docs_reference.py` and commit what it writes"


def test_a_field_without_description_is_named(monkeypatch):
    """The reference's check can fail: a field of the run config stripped of its description is reported by name,
    and the page it would write then differs from the committed one."""
    from cupid.eval.benchmark.runner import RunConfig

    references = _references()
    monkeypatch.setattr(RunConfig.model_fields["limit"], "description", None)
    assert references.config_problems() == ["cupid.eval.benchmark.runner.RunConfig.limit: no description"]
    assert references.config_page() != (REPO / references.CONFIG_PAGE).read_text()


def test_the_guide_builds_in_strict_mode(tmp_path):
    """`mkdocs build --strict` (`make docs`): every page in the nav, every link and anchor resolves. Not --quiet:
    mkdocs then counts no warning, and a broken link passes."""
    import os
    import subprocess
    import sys

    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


README_LIMIT = 12_000


def test_the_readme_is_a_front_page():
    """At most 12,000 characters, at most 3 timing figures (the rest live on docs/performance.md), and links into at
    least 4 pages of the guide, each of which exists, with the anchor it names."""
    text = (REPO / "README.md").read_text()
    assert len(text) <= README_LIMIT
    assert len(measured_durations(text)) <= 3
    links = re.findall(r"\]\((docs/[^)#]+\.md)(?:#([^)]*))?\)", text)
    pages = {page for page, _ in links}
    assert len(pages) >= 4 and all((REPO / page).is_file() for page in pages), pages
    # mkdocs checks the guide's own anchors; the README's, outside it, against the headings' slugs as the site has them
    from markdown.extensions.toc import slugify

    def anchors(page: str) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", (REPO / page).read_text(), re.MULTILINE)
        return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}

    assert [f"{p}#{a}" for p, a in links if a and a not in anchors(p)] == []
