"""`cupid eval run`'s options are RunConfig's fields: the same names and the same descriptions, so the two cannot
drift."""

import typer.main

from cupid.cli import app
from cupid.eval.runner import RunConfig

RUN = typer.main.get_command(app).commands["eval"].commands["run"]  # type: ignore[attr-defined]
OPTIONS = {p.name: p for p in RUN.params}
OWN = {"config", "dry_run", "allow_failures"}  # the command's own, not a run's


def test_every_run_config_field_is_an_option_with_its_description():
    fields = {name: f for name, f in RunConfig.model_fields.items() if name != "serve"}  # a map: config files only
    assert OPTIONS.keys() - OWN == fields.keys()
    for name, field in fields.items():
        assert field.description and OPTIONS[name].help.startswith(field.description), name


def test_option_names_and_kinds_stay_as_they_were():
    flags = {name: p.opts[0] for name, p in OPTIONS.items()}
    assert flags["tasks"] == "--task" and flags["settings"] == "--setting" and flags["types"] == "--type"
    assert flags["no_cache"] == "--no-cache" and OPTIONS["no_cache"].is_flag and OPTIONS["refresh"].is_flag
    assert OPTIONS["settings"].multiple and OPTIONS["types"].multiple and not OPTIONS["tasks"].multiple
    assert "GPU" not in OPTIONS["executor"].help and "CPU" in OPTIONS["executor"].help  # vllm-offline runs on CPU too
