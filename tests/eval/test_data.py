import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cupid.eval.benchmark import data
from cupid.eval.benchmark.data import DataError


@pytest.fixture
def rows():
    return [json.loads(line) for line in data.SAMPLE_PATH.read_text().splitlines()]


def test_the_sample_is_twelve_valid_instances_of_eight_sessions():
    dataset = data.load()
    assert dataset.bad_rows == []
    assert len(dataset.instances) == 12
    assert all(len(i.prior_interactions) == 8 for i in dataset.instances)
    assert len({i.key for i in dataset.instances}) == 12


def test_the_sample_holds_each_instance_type_alike():
    dataset = data.load()
    assert {t: sum(i.instance_type == t for i in dataset.instances) for t in data.INSTANCE_TYPES} == {
        "consistent": 4,
        "contrastive": 4,
        "changing": 4,
    }


def test_oracle_keeps_only_sessions_with_the_current_preference():
    for instance in data.load().instances:
        oracle = instance.sessions("oracle")
        assert 1 <= len(oracle) < len(instance.sessions("standard"))
        assert all(s["contextual_preference"] == instance.current_contextual_preference for s in oracle)


def test_filters():
    dataset = data.load()
    assert [i.instance_type for i in dataset.filter(types=["changing"]).instances] == ["changing"] * 4
    assert len(dataset.filter(limit=5).instances) == 5


def test_bad_rows_are_reported_with_file_line_key_and_field(tmp_path, rows):
    missing = dict(rows[0])
    del missing["current_checklist"]
    bad_role = json.loads(json.dumps(rows[1]))
    bad_role["prior_interactions"][2]["dialogue"][0]["role"] = "system"
    path = tmp_path / "data.jsonl"
    lines = [json.dumps(missing), json.dumps(bad_role), "{not json", json.dumps(rows[2]), json.dumps(rows[2])]
    path.write_text("\n".join(lines) + "\n")
    dataset = data.load(path)
    assert [i.key for i in dataset.instances] == [f"{rows[2]['persona_id']}/{rows[2]['instance_type']}"]
    problems = [str(b) for b in dataset.bad_rows]
    assert len(problems) == 4
    assert (
        f"{path}:1 ({rows[0]['persona_id']}/{rows[0]['instance_type']}): current_checklist: Field required"
        == problems[0]
    )
    assert f"{path}:2" in problems[1] and "prior_interactions.2.dialogue.0.role" in problems[1]
    assert f"{path}:3" in problems[2] and "not valid JSON" in problems[2]
    assert f"{path}:5" in problems[3] and "duplicate instance key, first seen at " + f"{path}:4" in problems[3]


def test_data_loads_from_parquet_json_or_a_directory_of_them(tmp_path, rows):
    pq.write_table(pa.Table.from_pylist(rows[:3]), tmp_path / "a.parquet")
    (tmp_path / "b.json").write_text(json.dumps(rows[3:5]))
    (tmp_path / "ignored.txt").write_text("not data")
    assert len(data.load(tmp_path / "a.parquet").instances) == 3
    assert len(data.load(tmp_path).instances) == 5


def test_unknown_sources_fail_clearly(tmp_path):
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="unsupported data file"):
        data.load(tmp_path / "x.csv")
    with pytest.raises(DataError, match="no such file or directory"):
        data.load(tmp_path / "missing.jsonl")


def test_hub_id_goes_through_datasets(monkeypatch, rows):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no probe of the Hub: datasets (stubbed) answers from its cache
    calls = []

    def fake_load_dataset(name, split):  # the network boundary
        calls.append((name, split))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = data.load("kixlab/CUPID")
    assert calls == [("kixlab/CUPID", "test")]
    assert len(dataset.instances) == 12 and dataset.source == "kixlab/CUPID[test]"


def test_hub_failure_is_a_clear_error(monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def unreachable(name, split):
        raise ConnectionError("Hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError, match=r"kixlab/CUPID \(split test\): could not load .*Hub unreachable"):
        data.load("kixlab/CUPID")


def test_a_hub_id_out_of_reach_fails_in_about_a_second_and_says_what_to_do(monkeypatch):
    """A Hub whose address refuses connections (a closed local port: the same on any machine, online or not)."""
    import time

    from typer.testing import CliRunner

    from cupid.cli import app

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    result = CliRunner().invoke(app, ["eval", "check-data", "kixlab/CUPID"])
    took = time.monotonic() - started
    assert result.exit_code != 0 and took < 5, (took, result.output)
    assert "kixlab/CUPID (split test): the Hugging Face Hub is out of reach: 127.0.0.1:9 cannot be reached" in (
        " ".join(result.output.split())
    )
    assert "HF_HUB_OFFLINE=1" in result.output
