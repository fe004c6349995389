import pytest

from cupid.common.config import ConfigError
from cupid.serving.registry import load_endpoints, missing_keys
from tests.helpers import REPO, write_endpoints


def test_project_endpoints():
    endpoints = load_endpoints(REPO / "configs" / "endpoints.yaml")
    assert endpoints["prefmatcher"].url == "http://localhost:8000/v1"
    assert endpoints["prefmatcher"].model == "kixlab/prefmatcher-7b"
    assert endpoints["gpt-4o"].model == "gpt-4o-2024-11-20" and endpoints["gpt-4o"].api_key_env == "OPENAI_API_KEY"
    assert endpoints["tiny"].max_concurrency >= 1


@pytest.mark.parametrize(
    "entry, field, message",
    [
        ({"base_url": "not a url", "model": "m"}, "base_url", "URL"),
        ({"base_url": "http://x/v1"}, "model", "Field required"),
        (
            {"base_url": "http://x/v1", "model": "m", "max_concurrency": 0},
            "max_concurrency",
            "greater than or equal to 1",
        ),
        ({"base_url": "http://x/v1", "model": "m", "colour": "red"}, "colour", "Extra inputs"),
        ({"base_url": "http://x/v1", "model": "m", "matcher_prompt": "zeroshot"}, "matcher_prompt", "prefmatcher"),
    ],
)
def test_errors_name_file_entry_and_field(tmp_path, entry, field, message):
    path = write_endpoints(tmp_path / "ep.yaml", good={"base_url": "http://x/v1", "model": "m"}, broken=entry)
    with pytest.raises(ConfigError) as e:
        load_endpoints(path)
    text = str(e.value)
    assert str(path) in text and "endpoint 'broken'" in text and field in text and message in text


def test_an_endpoints_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "ep.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_endpoints(path)


def test_a_missing_endpoints_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_endpoints(tmp_path / "nope.yaml")


def test_missing_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("CUPID_TEST_KEY", raising=False)
    endpoints = load_endpoints(
        write_endpoints(
            tmp_path / "ep.yaml", k={"base_url": "http://x/v1", "model": "m", "api_key_env": "CUPID_TEST_KEY"}
        )
    )
    assert missing_keys(endpoints) == ["CUPID_TEST_KEY"]
    monkeypatch.setenv("CUPID_TEST_KEY", "sk-test")
    assert missing_keys(endpoints) == []
