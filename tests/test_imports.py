"""Imports point down: the package has no import cycle, lazy imports inside functions included, and the exports (the
tracker, a run's tracked form) sit on top of the runner, which never imports them.

A lazy import hides a cycle from the interpreter, not from the design: the graph here is every `import` and
`from ... import` in each module's source (function bodies included, `if TYPE_CHECKING:` blocks excluded, since
they never run), read with `ast` from the folders pyproject.toml maps into the package.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

Graph = dict[str, set[str]]  # module -> the package's modules it imports


def parse(path: Path) -> ast.Module:
    """A module's syntax tree. CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per
    thread (python/cpython#106905): another thread building one meanwhile (a worker's leftover thread importing a
    module) makes `ast.parse` raise a spurious SystemError, as a fresh clone's suite once did. Parsed again then."""
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, str(path))
    except SystemError as e:
        if "recursion depth mismatch" not in str(e):
            raise
        return ast.parse(source, str(path))


def _modules() -> dict[str, Path]:
    """Each module of the package by its dotted name, found through [tool.setuptools.package-dir]."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in mapping.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [package, *path.relative_to(REPO / folder).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere in the module, but not in an `if TYPE_CHECKING:` body (its
    `else:` runs)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        children = node.orelse if isinstance(node, ast.If) and _type_checking(node) else ast.iter_child_nodes(node)
        todo.extend(children)
    return found


def import_graph() -> Graph:
    """The package's modules and, for each, the package's modules it imports (relative imports resolved; a name
    imported from a module is that module, or the submodule of that name)."""
    modules = _modules()
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in _imports(parse(path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle for each edge that leads back into a depth-first walk's path: none when the graph has none."""
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> None:
        path.append(node)
        for after in sorted(graph[node]):
            if after in path:
                found.append(path[path.index(after) :] + [after])
            elif after not in done:
                visit(after)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "cupid.eval.benchmark.runner" in graph and "cupid.serving.registry" in graph  # the mapping was read
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_the_exports_sit_on_top_of_the_runner() -> None:
    graph = import_graph()
    assert "cupid.eval.results.track" not in graph["cupid.eval.benchmark.runner"]
    track = graph["cupid.eval.results.track"]
    assert not track & {"cupid.eval.benchmark.runner", "cupid.eval.results.nightly"}, sorted(track)
    # inspect-ai loads the tasks in its own process: neither the package's top nor the API above everything comes along
    assert not graph["cupid.eval.integrations.inspect_tasks"] & {"cupid", "cupid.api"}


def test_one_export_list_and_every_name_on_it_resolves():
    import cupid
    import cupid.api

    assert not hasattr(cupid.api, "__all__")  # the list lives in cupid/__init__.py alone
    missing = [name for name in cupid.__all__ if getattr(cupid, name, None) is None]
    assert missing == [] and {"ConfigError", "format_reward", "PrefMatcher", "evaluate"} <= set(cupid.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        cupid.nothing_here  # noqa: B018


def test_no_library_module_imports_typer():
    """Every command lives in cupid/cli/; the layers below it are a library a script or notebook uses as it is."""
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("matcher", "serving", "eval", "training")
        for path in (REPO / folder).rglob("*.py")
        if any(
            isinstance(node, ast.Import | ast.ImportFrom)
            and any(
                (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] == "typer"
                for alias in node.names
            )
            for node in ast.walk(parse(path))
        )
    ]
    assert offenders == []
    assert (REPO / "cupid" / "api.py").exists() and not list((REPO / "cupid").glob("cli.py"))


def test_no_two_modules_of_a_folder_look_alike():
    """endpoint/endpoints, track/tracked: a newcomer opens the wrong one. No module is another's name plus s, d or
    ed."""
    pairs = []
    for folder in ("cupid", "cupid/cli", "matcher", "serving", "eval", "training", "training/synth"):
        stems = {p.stem for p in (REPO / folder).glob("*.py")}
        pairs += [(folder, a, b) for a in stems for b in stems if b in (a + "s", a + "d", a + "ed")]
    assert pairs == []


def test_no_two_classes_of_the_package_share_a_name():
    """Two `Judges`, two `Row`s: an import then needs an alias to tell them apart. Private bases aside."""
    seen: dict[str, list[str]] = {}
    for folder in ("cupid", "matcher", "serving", "eval", "training"):
        for path in (REPO / folder).rglob("*.py"):
            for node in parse(path).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    seen.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
