"""The slow tier is read from the fixtures a test names (tests/plugins/collection.py). A shared fixture that asks for
a slow one itself would make every test that uses it slow without saying so: its fast tests would never run in
`make check`, as five instant-server tests once did through `endpoints`."""

import ast

from tests.helpers import REPO
from tests.plugins.collection import SLOW_FIXTURES


def _fixtures(tree: ast.Module) -> dict[str, set[str]]:
    """Each fixture of a module and the fixtures its signature asks for."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            found[node.name] = {a.arg for a in node.args.args}
    return found


def test_no_shared_fixture_hides_a_slow_one():
    fixtures = _fixtures(ast.parse((REPO / "tests" / "conftest.py").read_text(encoding="utf-8")))
    assert "endpoints" in fixtures  # the file was read
    hiding = {name: sorted(asked & SLOW_FIXTURES) for name, asked in fixtures.items() if name not in SLOW_FIXTURES}
    assert {name: slow for name, slow in hiding.items() if slow} == {}
