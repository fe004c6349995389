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

from tests.helpers import REPO

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
                # a submodule imported from its package is that module (a package's `__init__` defines nothing)
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
    ("cupid.serving.offline", "cupid.serving.executors", "cupid.serving.fleet"),  # engine, run client, servers
    ("cupid.eval.benchmark",),  # tasks, the runner, a run's files and figures
    ("cupid.eval.results", "cupid.eval.integrations"),  # what is read from finished runs; inspect-ai, TRL's reward
    ("cupid.eval.workflows",),  # a night, a logged run: above the packages they join
    ("cupid.training",),
    ("cupid.api",),
    ("cupid.cli", "cupid.__main__"),
]


@functools.cache
def packages() -> frozenset[str]:
    """Each package (its `__init__`)."""
    return frozenset(name for name, path in _modules().items() if path.stem == "__init__")


def layer_of(module: str) -> int:
    """A module's layer; a package sits with the highest of the modules under it."""
    if module in packages():
        inside = [m for m in _modules() if m.startswith(module + ".") and m not in packages()]
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
    client_side = [m for m in graph if layer_of(m) == 2 and m not in packages()]
    assert len(client_side) == 4, client_side
    crossing = sorted(f"{m} -> {i}" for m in client_side for i in graph[m] if i.startswith("cupid.serving.servers"))
    assert crossing == []


def test_the_export_list_lives_in_the_package_top_alone():
    import cupid.api

    assert not hasattr(cupid.api, "__all__")  # the list lives in cupid/__init__.py alone


def test_every_exported_name_resolves_and_an_unknown_one_raises():
    import cupid

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
    """A task's name is said in its declaration, in the task's own module, alone; elsewhere code reads `TASKS`.
    A prompt file of the same name (`prompts.load("inference")`) is the prompt's name, not the task's."""
    from cupid.eval.benchmark.tasks import TASKS

    own = {spec.block.figures.__module__: spec.name for spec in TASKS.values()}  # where each task declares itself
    assert len(own) == len(TASKS)  # each in a module of its own
    named = []
    for module, path in sorted(_modules().items()):
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
            if isinstance(node, ast.Constant)
            and node.value in TASKS
            and id(node) not in loads
            and node.value != own.get(module)
        ]
    assert named == []
    assert len(TASKS) == 2  # the check looks for something


def test_every_setting_is_declared_once_with_what_it_adds():
    from cupid.eval.benchmark.settings import SETTING_SPECS, SETTINGS, extra_prompts, extra_roles

    assert tuple(SETTING_SPECS) == SETTINGS
    assert extra_roles(SETTINGS) == ["summarizer"] and extra_prompts(["standard", "summary"]) == ["summarizer"]
    assert extra_roles(["standard", "oracle"]) == []


def _defined(tree: ast.Module) -> set[str]:
    """The names a module's top level defines (functions, classes, assignments, under `if`/`try` too), not those it
    imports."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            todo += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return names


def names_taken_past_their_module(paths: list[Path]) -> list[str]:
    """Each `from cupid.x import name` in these files whose module does not define `name` (nor has it as a
    submodule): the name is passed on by a module that imported it, where it should come from its own."""
    modules = _modules()
    defined = {module: _defined(parse(path)) for module, path in modules.items()}
    found = []
    for path in paths:
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("cupid."):
                if node.module not in modules:  # a module renamed or gone
                    found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno}"
                                 f" from {node.module}: no such module")  # fmt: skip
                    continue
                found += [
                    f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno}"
                    f" from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name not in defined[node.module] and f"{node.module}.{alias.name}" not in modules
                ]
    return found


def test_every_name_is_imported_from_the_module_that_defines_it(tmp_path):
    """Go-to-definition and grep land on the code: no module passes on a name it imported, in the package, its tests,
    bench/ and scripts/. `cupid` itself is the API users import (its names come from `cupid.api` on first use), and
    `cupid.api` names the types its signatures take; the users' imports, not the package's."""
    files = [p for folder in ("cupid", "matcher", "serving", "eval", "training", "tests", "bench", "scripts")
             for p in sorted((REPO / folder).rglob("*.py"))]  # fmt: skip
    files = [p for p in files if "figures_before_one_computation" not in p.parts]  # runs on an old commit's package
    taken = [line for line in names_taken_past_their_module(files) if " from cupid import " not in line]
    taken = [line for line in taken if " from cupid.api import " not in line or "tests/test_api.py" in line]
    assert taken == [], "\n".join(taken)
    # The check can fail: `cupid.serving.registry` imports `Endpoint` from the module that defines it.
    probe = tmp_path / "probe.py"
    probe.write_text("from cupid.serving.registry import Endpoint, lookup\nfrom cupid.eval import benchmark\n")
    assert names_taken_past_their_module([probe]) == [f"{probe}:1 from cupid.serving.registry import Endpoint"]


def test_no_module_but_the_package_top_defines_a_lazy_getattr():
    """`cupid/__init__.py` is the one lazy module, the API users import (as vLLM's and TRL's top packages are): a
    module-level `__getattr__` anywhere else would hide where a name is defined."""
    lazy = [
        module
        for module, path in sorted(_modules().items())
        if "__getattr__" in {n.name for n in parse(path).body if isinstance(n, ast.FunctionDef)}
        or "__getattr__" in _defined(parse(path))
    ]
    assert lazy == ["cupid"]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_taken(modules: dict[str, Path]) -> list[str]:
    """Each leading-underscore name one module of these takes from another of the package: imported by name
    (`from cupid.x import _name`), or read through an imported module (`x._name`)."""
    known = _modules()
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        tree, where = parse(path), path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
        through: dict[str, str] = {}  # a local name bound to a package module -> that module
        for node in _imports(tree, type_checking=True):
            if isinstance(node, ast.Import):
                through |= {a.asname: a.name for a in node.names if a.asname and a.name in known}
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base not in known:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    through[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif _private(alias.name) and base != name:
                    found.append(f"{where}:{node.lineno} from {base} import {alias.name}")
        found += [
            f"{where}:{node.lineno} {node.value.id}.{node.attr} ({through[node.value.id]})"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in through
            and through[node.value.id] != name
            and _private(node.attr)
        ]
    return found


def test_no_module_takes_another_modules_private_name(tmp_path):
    """A leading underscore says a name is its module's own business: where another module needs it, it is public
    in its home, so that changing a private name never breaks a module that is not its own."""
    taken = private_names_taken(_modules())
    assert taken == [], "\n".join(taken)
    # The check can fail: the verdict's text taking compare's private unit words, by name and through the module.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from cupid.eval.results.compare import _units\nfrom cupid.eval.results import compare\ncompare._units(c)\n"
    )
    assert private_names_taken({"cupid.eval.results.probe": probe}) == [
        "probe.py:1 from cupid.eval.results.compare import _units",
        "probe.py:3 compare._units (cupid.eval.results.compare)",
    ]


def test_the_results_import_nothing_of_the_runner_or_the_fleet() -> None:
    """What reads finished runs (reports, comparisons, the leaderboard, the tracker) never imports the module that
    runs one or the servers it starts, TYPE_CHECKING imports included: a reader stays light and cannot start work."""
    graph = import_graph(type_checking=True)
    results = [module for module in graph if module.startswith("cupid.eval.results.")]
    assert "cupid.eval.results.regressions" in results  # the mapping was read
    reaching = sorted(
        f"{module} -> {imported}"
        for module in results
        for imported in graph[module]
        if imported == "cupid.eval.benchmark.runner" or imported.startswith("cupid.serving.fleet")
    )
    assert reaching == [], "\n".join(reaching)
