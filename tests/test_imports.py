"""Imports point down: the package has no import cycle, lazy imports inside functions included, and the exports (the
tracker, a run's tracked form) sit on top of the runner, which never imports them.

A lazy import hides a cycle from the interpreter, not from the design: the graph here is every `import` and
`from ... import` in each module's source (function bodies included, `if TYPE_CHECKING:` blocks excluded, since
they never run), read with `ast` from the folders pyproject.toml maps into the package.
"""

from __future__ import annotations

import ast
import functools
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


@functools.cache
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


def _imports(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere in the module, but not in an `if TYPE_CHECKING:` body (its
    `else:` runs) unless `type_checking` asks for those too."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        skip = not type_checking and isinstance(node, ast.If) and _type_checking(node)
        children = node.orelse if skip else ast.iter_child_nodes(node)
        todo.extend(children)
    return found


def import_graph(type_checking: bool = False) -> Graph:
    """The package's modules and, for each, the package's modules it imports (relative imports resolved; a name
    imported from a module is that module, a submodule imported from its package that submodule); `type_checking`:
    the imports only a type checker reads too."""
    modules = _modules()
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in _imports(parse(path), type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                # a submodule imported from its package is that module (the package's face only names things)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
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
    """Not even one a type checker alone follows: `if TYPE_CHECKING:` imports make a circle in the design too."""
    graph = import_graph(type_checking=True)
    assert "cupid.eval.benchmark.runner" in graph and "cupid.serving.registry" in graph  # the mapping was read
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


# The layers, bottom first: a module imports its own layer's and the layers below, never one above. A module is in
# the layer of the longest prefix here that names it.
LAYERS: list[tuple[str, ...]] = [
    ("cupid.common",),  # configuration, errors, loop helpers, files: every layer's
    ("cupid.matcher",),  # the matcher's prompts, parsing, scores
    # the client side of serving: it never imports the servers this project starts (below: its own test)
    ("cupid.serving.endpoint", "cupid.serving.cache", "cupid.serving.registry", "cupid.serving.client"),
    ("cupid.serving.servers",),  # the servers this project starts
    ("cupid.serving.offline", "cupid.serving.fleet"),  # an engine in this process; the servers a run brings
    ("cupid.eval.benchmark",),  # tasks, the runner, a run's files and figures
    ("cupid.eval.results", "cupid.eval.integrations"),  # what is read from finished runs; inspect-ai, TRL's reward
    ("cupid.eval.workflows",),  # a night, a logged run: above the rooms they join
    ("cupid.training",),
    ("cupid.api",),
    ("cupid.cli", "cupid.__main__"),
]


@functools.cache
def faces() -> frozenset[str]:
    """Each package's `__init__`: its face, which may show the names of any of its modules (lazily)."""
    return frozenset(name for name, path in _modules().items() if path.stem == "__init__")


def layer_of(module: str) -> int:
    """A module's layer; a package's face sits with the highest of the modules under it."""
    if module in faces():
        inside = [m for m in _modules() if m.startswith(module + ".") and m not in faces()]
        return max(layer_of(m) for m in inside)
    found = [(len(prefix), i) for i, names in enumerate(LAYERS) for prefix in names
             if module == prefix or module.startswith(prefix + ".")]  # fmt: skip
    assert found, f"{module}: in no layer of LAYERS"
    return max(found)[1]


def test_imports_only_point_down_the_layers() -> None:
    """Every module is in a layer, and none imports a layer above its own, TYPE_CHECKING imports included."""
    graph = import_graph(type_checking=True)
    upward = sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for imported in imports
        if layer_of(imported) > layer_of(module)
    )
    assert upward == [], "imports up the layers:\n" + "\n".join(upward)
    # The check can fail: the runner importing the tracker would be an upward import.
    assert layer_of("cupid.eval.results.track") > layer_of("cupid.eval.benchmark.runner")
    # inspect-ai loads the tasks in its own process: neither the package's top nor the API above everything comes along
    assert not graph["cupid.eval.integrations.inspect_tasks"] & {"cupid", "cupid.api"}


def test_the_client_side_never_imports_the_servers_side() -> None:
    """What talks to a server (endpoint, cache, registry, client) knows nothing of the servers this project starts:
    what it must know of them is handed in (`started`, `down_hint`)."""
    graph = import_graph(type_checking=True)
    client_side = [m for m in graph if layer_of(m) == 2 and m not in faces()]
    assert len(client_side) == 4, client_side
    crossing = sorted(f"{m} -> {i}" for m in client_side for i in graph[m] if i.startswith("cupid.serving.servers"))
    assert crossing == []


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


def test_no_module_but_the_task_declarations_names_a_task():
    """A task's name is said in its declaration (`eval/benchmark/tasks.py`) alone; elsewhere code reads `TASKS`.
    A prompt file of the same name (`prompts.load("inference")`) is the prompt's name, not the task's."""
    from cupid.eval.benchmark import TASKS

    named = []
    for module, path in sorted(_modules().items()):
        if module == "cupid.eval.benchmark.tasks":
            continue
        tree = parse(path)
        loads = {
            id(arg)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "load"
            for arg in node.args
        }
        named += [
            f"{module}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in TASKS and id(node) not in loads
        ]
    assert named == []
    assert len(TASKS) == 2  # the check looks for something


def test_every_setting_is_declared_once_with_what_it_adds():
    from cupid.eval.benchmark import SETTING_SPECS, SETTINGS, extra_prompts, extra_roles

    assert tuple(SETTING_SPECS) == SETTINGS
    assert extra_roles(SETTINGS) == ["summarizer"] and extra_prompts(["standard", "summary"]) == ["summarizer"]
    assert extra_roles(["standard", "oracle"]) == []


def test_callers_outside_a_room_import_from_its_face():
    """A room's face names what the rest of the package uses of it (`EXPORTS`); a module outside the room that takes
    such a name from the module that defines it reaches past the face. A name the face cannot give (one that is also
    a submodule's, `reward`; one that two modules define, `scored`) is taken from its module, with its neighbours."""
    import importlib

    modules = _modules()
    exports = {
        face: getattr(importlib.import_module(face), "EXPORTS", {})
        for face in faces()
        if face not in ("cupid", "cupid.cli")
    }
    assert sum(map(len, exports.values())) > 100  # the faces name things: the check has something to hold
    reaching = []
    for module, path in sorted(modules.items()):
        for node in ast.walk(parse(path)):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                continue
            face = node.module.rpartition(".")[0]
            if face not in exports or module == face or module.startswith(face + "."):
                continue
            names = [a.name for a in node.names]
            if any(f"{face}.{n}" in modules or exports[face].get(n, node.module) != node.module for n in names):
                continue  # a name the face cannot give (a submodule's, or another module's): its neighbours stay
            named = [n for n in names if exports[face].get(n) == node.module]
            if named:
                reaching.append(f"{module}: from {node.module} import {', '.join(named)} (the face: {face})")
    assert reaching == [], "\n".join(reaching)


def test_each_face_names_its_exports_once_in_three_places_that_agree():
    """A face lists each name in EXPORTS (for the lazy import), in `__all__` (for `import *` and the linters) and
    under TYPE_CHECKING (for the type checker): the three must hold the same names, from the same modules."""
    import importlib

    checked = 0
    for face in sorted(faces()):
        module = importlib.import_module(face)
        exports = getattr(module, "EXPORTS", None)
        if exports is None:
            continue
        typed = {
            alias.asname or alias.name: node.module
            for block in parse(_modules()[face]).body
            if isinstance(block, ast.If) and _type_checking(block)
            for node in block.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert sorted(module.__all__) == sorted(exports), face
        assert typed == exports, face
        checked += 1
    assert checked >= 10
