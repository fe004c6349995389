"""A training run's directory owns its files' names: the stages ask it, and no other module of the package or script
spells one."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from cupid.common.config import ConfigError
from cupid.training.sft import SftReport
from cupid.training.traindir import REPORTS, TrainDir
from tests.helpers import REPO
from tests.test_imports import _modules

# Names that are not this project's: files of the model directories Hugging Face writes and reads, /proc/<pid>/stat
OTHERS_FILES = {"config.json", "adapter_config.json", "tokenizer_config.json", "chat_template.jinja", "stat"}


def spelled_file_names(source: str) -> list[str]:
    """Each path a module builds from a literal name (`x / "adapter"`, `.with_name(...)`), and each use of a
    config's `out_dir`: the places a training file's name would be spelled outside TrainDir."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if node.right.value not in OTHERS_FILES:
                found.append(f"{node.lineno}: / {node.right.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("out_dir", "with_name"):
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_no_training_module_but_traindir_spells_a_file_name():
    spelled = {
        path.name: found
        for path in sorted((REPO / "training").glob("*.py"))
        if path.name not in ("traindir.py", "config.py")  # config.py defines `out_dir`
        and (found := spelled_file_names(path.read_text()))
    }
    assert spelled == {}
    # the check can fail: the export's directory spelled as it was before TrainDir
    assert spelled_file_names('out = cfg.out_dir / "export"\ntmp = out.with_name("x")') == [
        "1: / 'export'",
        "1: .out_dir",
        "2: .with_name",
    ]


def owned_names() -> set[str]:
    """Every name TrainDir gives a file or directory of a run (read from TrainDir itself, so a name it adds is held
    too), less those other owners give their own files as well: `data`, `eval` and `label` (the package's folders,
    its data resources), `endpoints.yaml` (the project's configs/endpoints.yaml), `report.json` (any report's)."""
    run = TrainDir(Path("/run"))
    paths = [v for v in vars(run).values() if isinstance(v, Path)]
    paths += [getattr(run, name) for name, v in vars(TrainDir).items() if isinstance(v, property)]
    paths += [run.report_path(stage) for stage in REPORTS] + [run.split("train"), run.split("validation")]
    names = {part for path in paths for part in path.relative_to(run.path).parts}
    assert {"adapter", "checkpoints", "export", "train_report.json", "grpo_report.json"} <= names
    return names - {"data", "eval", "label", "endpoints.yaml", "report.json"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _path_parts(tree: ast.AST) -> set[int]:
    """The strings a path is built from: the operands of `/`, and the arguments of `Path(...)` and `.joinpath(...)`."""
    parts: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts += [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
            "Path",
            "joinpath",
        ):
            parts += node.args
    return {id(part) for part in parts}


def names_spelled(source: str, names: set[str]) -> list[str]:
    """Each string in the code (docstrings aside: they may say where a file goes) that spells one of `names` as a path:
    a file's name anywhere (`"grpo_report.json"`), a directory's where a path is built (`out / "adapter"`,
    `f"{out}/export"`): "adapter" and "export" alone are also the stages' and the check's words."""
    tree = ast.parse(source)
    docstrings, path_parts = _docstrings(tree), _path_parts(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docstrings:
            continue
        parts = set(node.value.replace("\\", "/").split("/")) & names
        in_a_path = "/" in node.value or id(node) in path_parts
        if any("." in name for name in parts) or (parts and in_a_path):
            found.append(f"{node.lineno}: {node.value!r}")
    return found


def test_no_module_or_script_but_traindir_spells_a_training_name():
    names = owned_names()
    files = [path for path in _modules().values() if path.name != "traindir.py"]
    files += sorted((REPO / "scripts").glob("*.py"))
    spelled = {
        str(path.relative_to(REPO)): found for path in files if (found := names_spelled(path.read_text(), names))
    }
    assert spelled == {}
    # the check can fail: the GPU check's report path as it was spelled before, a directory in an f-string and in Path()
    source = (
        '"""docstring: <out>/adapter"""\nreport = a.out / "grpo" / "grpo_report.json"\nmerged = f"{out}/export"\n'
        'lora = Path(out, "adapter")\nblocks = {"adapter": 1, "export": 2}\n'
    )
    assert sorted(names_spelled(source, names)) == ["2: 'grpo_report.json'", "3: '/export'", "4: 'adapter'"]


def test_match_data_given_by_the_config_is_read_where_it_is(tmp_path):
    run = TrainDir(tmp_path / "run", match_data=tmp_path / "made-elsewhere")
    assert run.split("validation") == tmp_path / "made-elsewhere" / "validation.jsonl"
    assert run.adapter == tmp_path / "run" / "adapter"  # the run's own files stay in the run


def test_an_export_takes_its_name_only_when_written_whole(tmp_path):
    run = TrainDir(tmp_path)
    with run.writing_export() as partial:
        (partial / "config.json").parent.mkdir(parents=True)
        (partial / "config.json").write_text("{}")
        assert not run.export.exists()
    assert run.has_export() and not partial.exists()


def test_an_export_that_fails_halfway_leaves_the_previous_one(tmp_path):
    run = TrainDir(tmp_path)
    run.export.mkdir()
    (run.export / "config.json").write_text('{"previous": true}')
    with pytest.raises(OSError), run.writing_export() as partial:
        partial.mkdir()
        raise OSError("disk full")
    assert (run.export / "config.json").read_text() == '{"previous": true}'


def test_a_report_reads_back_as_its_type_nan_loss_included(tmp_path):
    run = TrainDir(tmp_path)
    fields = {name: 0 for name, f in SftReport.model_fields.items() if f.annotation is int}
    report = SftReport.model_construct(
        **fields, base_model="b", adapter="a", resumed_from=None, precision="fp32", quantization=None, lora={},
        loss_before={"train": 1.0}, loss_after={"train": float("nan")}, logged_losses=[], throughput=[],
        mean_tokens_per_s=None, peak_gpu_memory_gib=None, gpu_memory_gib=None, train_runtime_s=0.0, wall_s=0.0,
        hyperparameters={}, liger={"use_liger_kernel": False},
    )  # fmt: skip
    path = run.write_report("sft", report)
    assert path == tmp_path / "train_report.json" and '"train": NaN' in path.read_text()
    read = run.read_report("sft", SftReport)
    assert read is not None and math.isnan(read.loss_after["train"])


def test_a_report_not_written_reads_as_none(tmp_path):
    assert TrainDir(tmp_path).read_report("sft", SftReport) is None


def test_a_report_its_type_refuses_names_its_file(tmp_path):
    run = TrainDir(tmp_path)
    run.report_path("sft").write_text('{"base_model": 1}')
    with pytest.raises(ConfigError, match="train_report.json: not a SftReport"):
        run.read_report("sft", SftReport)
