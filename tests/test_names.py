"""Names a newcomer reads: a test's name says one behaviour in at most 80 characters, and the package's code speaks of
the project, not of the tooling that arranged it."""

from __future__ import annotations

import ast
import re

from tests.helpers import REPO

LONGEST_TEST_NAME = 80
# Words of the tooling that once arranged the package (its packages were "rooms", their __init__ "faces").
TOOLING_WORDS = re.compile(r"\b(rooms?|faces?)\b", re.IGNORECASE)


def names_of_tests(source: str) -> list[str]:
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    ]


def test_every_test_name_fits_in_80_characters():
    names = [name for path in sorted((REPO / "tests").rglob("test_*.py")) for name in names_of_tests(path.read_text())]
    assert len(names) > 300  # the suite was read
    assert [n for n in names if len(n) > LONGEST_TEST_NAME] == []
    too_long = names_of_tests("def test_" + "x" * 80 + "(): pass")  # the check can fail: 85 characters
    assert [n for n in too_long if len(n) > LONGEST_TEST_NAME] == too_long != []


def test_the_package_speaks_no_tooling_vocabulary():
    """The Hugging Face Hub's "faces" are a name, not the word: only the words standing alone count."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for folder in ("cupid", "matcher", "serving", "eval", "training", "tests", "bench", "scripts")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.name != "test_names.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if TOOLING_WORDS.search(line.replace("Hugging Face", ""))
    ]
    assert found == []
    assert TOOLING_WORDS.search("callers outside a room import from its face")  # the check can fail
