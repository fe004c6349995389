"""Every shipped run config is valid and names endpoints that exist."""

from pathlib import Path

import pytest

from cupid.common.config import read_yaml, validate
from cupid.eval.benchmark.runner import RunConfig
from cupid.serving.registry import load_endpoints

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "eval").glob("*.yaml")), ids=lambda p: p.name)
def test_run_configs_are_valid(path):
    raw = read_yaml(path)
    if "models" in raw:  # a nightly suite: its shared `run` block plus each model as candidate
        raw = {**raw["run"], "candidate": raw["models"][0]}
    cfg = validate(RunConfig, raw, str(path))
    endpoints = load_endpoints(REPO / cfg.endpoints)
    for name in [*cfg.roles().bound().values(), cfg.reference]:
        assert name is None or name in endpoints, f"{path.name}: no endpoint '{name}'"


def test_the_exit_codes_are_stated_as_the_code_defines_them():
    """The nightly file, the guide (troubleshooting's table, the nightly's page) and `cupid nightly --help` state the
    codes the verdicts exit with."""
    from typer.testing import CliRunner

    from cupid.cli import app
    from cupid.common.errors import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_REGRESSION, EXIT_USAGE

    stated = f"{EXIT_FAILED} failures; {EXIT_REGRESSION} a regression; {EXIT_NO_VERDICT} no verdict ({EXIT_USAGE}:"
    assert stated in (REPO / "configs/eval/nightly.yaml").read_text()
    guide = (REPO / "docs" / "troubleshooting.md").read_text()
    table = {EXIT_FAILED: "the work failed", EXIT_USAGE: "a usage", EXIT_REGRESSION: "a regression"}
    for code, meaning in {**table, EXIT_NO_VERDICT: "no verdict"}.items():
        assert f"\n| {code} | {meaning}" in guide, code
    night = f"{EXIT_FAILED} failures, {EXIT_REGRESSION} a regression, {EXIT_NO_VERDICT} no verdict"
    assert night in " ".join((REPO / "docs" / "nightly.md").read_text().split())
    said = " ".join(CliRunner().invoke(app, ["nightly", "--help"]).output.replace("│", " ").split())
    assert f"{night} ({EXIT_USAGE}:" in said
