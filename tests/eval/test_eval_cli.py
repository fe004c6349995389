"""`cupid eval run`'s options are RunConfig's fields: the same names and the same descriptions, so the two cannot
drift."""

import typer.main

from cupid.cli import app
from cupid.eval.benchmark.runner import RunConfig

RUN = typer.main.get_command(app).commands["eval"].commands["run"]  # type: ignore[attr-defined]
OPTIONS = {p.name: p for p in RUN.params}
OWN = {"config", "dry_run", "allow_failures", "no_cache"}  # the command's own (--no-cache: `cache: null`), not a run's


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


def test_a_cache_is_spelled_one_way_the_old_no_cache_read_as_the_new_name(tmp_path):
    """A path, `default`, or null (none): the same in a run config as in `cupid.evaluate`, PrefMatcher and the
    reward; the old `no_cache: true` still turns it off, with a warning naming `cache: null`."""
    import pytest

    from cupid.serving.cache import cache_path

    roles = {"candidate": "c", "decomposer": "d", "matcher": "m"}
    assert RunConfig(**roles).cache == "default" and cache_path("default").name == "cache.sqlite"
    assert RunConfig(**roles, cache=None).cache is None and cache_path(None) is None
    assert cache_path(str(tmp_path / "mine.sqlite")) == tmp_path / "mine.sqlite"
    with pytest.warns(FutureWarning, match=r"`no_cache: true` is now `cache: null`"):
        assert RunConfig.model_validate({**roles, "no_cache": True}).cache is None
    assert "no_cache" not in RunConfig.model_fields
