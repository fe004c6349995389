"""The command as a user meets it after `pip install cupid-eval`: run from a directory of their own, with the state
under CUPID_HOME. Shipped profiles and recipes name the models the project prepares (`prepared:NAME`), found under
the state directory wherever the command runs; `cupid demo --dry-run` writes only under its --out."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cupid.common.config import read_yaml
from cupid.common.files import prepared_model
from cupid.serving.servers import profiles

CUPID = [sys.executable, "-m", "cupid"]


def cupid(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUPID_HOME": str(home), "COLUMNS": "300"}
    return subprocess.run([*CUPID, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_shipped_profiles_and_recipes_name_prepared_models_not_relative_paths():
    tiny = profiles.load("tiny")
    assert tiny.model == "prepared:SmolLM2-135M-Instruct"
    for path in ("configs/train/grpo-tiny.yaml", "configs/train/grpo-qwen2.5-7b.yaml"):
        recipe = read_yaml(path)
        assert not str(recipe.get("policy", "")).startswith("."), path
        assert not str(recipe["reward"].get("cache", "")).startswith("."), path


def test_a_prepared_model_is_found_under_cupid_home_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPID_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    assert prepared_model("prepared:SmolLM2-135M-Instruct") == str(
        tmp_path / "state" / "models" / "SmolLM2-135M-Instruct"
    )
    assert profiles.load("tiny").model_path() == str(tmp_path / "state" / "models" / "SmolLM2-135M-Instruct")
    assert prepared_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_serving_the_tiny_profile_unprepared_names_the_command_that_prepares_it(tmp_path):
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    done = cupid("serve", "up", "--profile", "tiny", cwd=work, home=home)
    assert done.returncode == 2, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert f"{home}/models/SmolLM2-135M-Instruct not found" in out and "cupid serve prepare-tiny" in out, out
    assert "Traceback" not in out and not list(work.iterdir())


def test_the_demo_dry_run_from_an_empty_directory_writes_only_its_requests_under_out(tmp_path):
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    done = cupid("demo", "--dry-run", "--out", str(tmp_path / "out"), cwd=work, home=home)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"{home}/models/SmolLM2-135M-Instruct" in done.stderr and "serve profile 'tiny'" in done.stderr
    assert files_under(tmp_path) == [tmp_path / "out" / "requests.jsonl"]
    assert len((tmp_path / "out" / "requests.jsonl").read_text().splitlines()) == 12  # 6 instances, both tasks


def cuda_torchvision(root: Path) -> Path:
    """A torchvision as the package index gives it beside a CPU torch: its build label is not torch's (`0.28.0`, not
    `+cpu`), and importing it fails as the real one does there. On PYTHONPATH, it stands in for the 7 MB download."""
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    info = root / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    (info / "RECORD").write_text("")
    return root


@pytest.mark.slow  # ~28 s (a fresh environment installed): `make test` runs it, `make check` does not
def test_doctor_names_the_command_that_fixes_a_cuda_torchvision_beside_cpu_torch(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    healthy = cupid("doctor", cwd=work, home=tmp_path / "state")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    for part in ("cupid-eval", "torch", "vLLM", "transformers", "training", "GPU", "torch companions"):
        assert part in healthy.stdout
    assert healthy.stdout.strip().endswith("ok: nothing broken")
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "state"), "PYTHONPATH": str(cuda_torchvision(tmp_path / "tv"))}
    for args in (["doctor"], ["serve", "prepare-tiny"]):  # prepare-tiny: transformers' import meets torchvision
        done = subprocess.run(
            [*CUPID, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        out = done.stdout + done.stderr
        assert done.returncode in (1, 2) and "Traceback" not in out, out
        assert "pip uninstall -y torchvision" in out.splitlines()[-1], out


def test_the_demo_on_a_taken_port_says_so_in_one_line_and_another_port_is_taken_up(tmp_path):
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    prepared = home / "models" / "SmolLM2-135M-Instruct"  # as prepare-tiny leaves it (the demo stops before loading it)
    prepared.mkdir(parents=True)
    (prepared / "config.json").write_text('{"dtype": "bfloat16"}')
    (prepared / "model.safetensors").write_bytes(b"")
    (prepared / "tokenizer.json").write_text("{}")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = cupid("demo", "--port", str(port), cwd=work, home=home)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: port {port} on 127.0.0.1 is taken"), done.stderr
    assert "Traceback" not in done.stderr and not list(work.iterdir())
    planned = cupid("demo", "--port", "8611", "--dry-run", "--out", str(tmp_path / "out"), cwd=work, home=home)
    assert "serve profile 'tiny' on :8611" in planned.stderr, planned.stderr


WATCHED = """import atexit, sys
atexit.register(lambda: print("vllm imported" if "vllm" in sys.modules else "vllm not imported", file=sys.stderr))
{body}
"""
CLI = "from cupid.cli import app\nsys.argv[0] = 'cupid'\napp()"
API = """import cupid
from cupid.common.config import ConfigError
try:
    cupid.evaluate(
        "{candidate}", matcher="{judge}", decomposer="{judge}", out="run", cache="cache.sqlite", progress=False
    )
except ConfigError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


def refused(tmp_path: Path, body: str, *args: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """`body` run from an empty directory with a fresh CUPID_HOME and a fresh user cache (vLLM's parser's results are
    kept there), as a first-time user meets it."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(parents=True)
    script = tmp_path / "watched.py"
    script.write_text(WATCHED.format(body=body))
    env = {**os.environ, "CUPID_HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    done = subprocess.run([sys.executable, str(script), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    return done, work, home


def test_endpoints_that_do_not_answer_are_refused_by_the_cli_before_vllm_or_any_file(tmp_path):
    """The shipped endpoints' `tiny` with no server on its port, from a fresh directory: exit 2 naming every role and
    how to start it; vLLM is not imported (its parser is read where a server starts, not for a refusal's hint) and
    nothing is written: no run directory, no cache."""
    roles = [
        arg for role in ("candidate", "decomposer", "matcher", "judge", "summarizer") for arg in (f"--{role}", "tiny")
    ]
    with socket.socket() as probe:  # the shipped entry's port: free, or this check is moot
        if probe.connect_ex(("127.0.0.1", 8011)) == 0:
            pytest.skip("something listens on 127.0.0.1:8011")
    done, work, home = refused(tmp_path, CLI, "eval", "run", *roles, "--limit", "2", "--out", "runs/x")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-2].startswith("error: candidate, decomposer, matcher, judge, summarizer 'tiny' at "), lines
    assert lines[-2].endswith("start it: cupid serve up --profile tiny; nothing was sent to it"), lines
    assert lines[-1] == "vllm not imported"
    assert not list(work.iterdir()) and not home.exists()


def test_the_python_api_refuses_the_same_way_naming_the_role_and_the_api_path(tmp_path, instant_url):
    from cupid.serving.servers.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    done, work, home = refused(tmp_path, API.format(candidate=dead, judge=instant_url))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-2].startswith(f"candidate '{dead}': {dead}/models: nothing answers (ConnectError"), lines
    assert lines[-1] == "vllm not imported"
    assert not list(work.iterdir()) and not home.exists()

    # by name (the shipped endpoints file's `tiny`, nothing on its port): the run's own refusal, before any file
    done, work, home = refused(tmp_path / "named", API.format(candidate="tiny", judge="tiny"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-2].startswith("candidate, decomposer, matcher 'tiny' at http://127.0.0.1:8011/v1 does not answer")
    assert lines[-1] == "vllm not imported"
    assert not list(work.iterdir()) and not home.exists()

    bare = instant_url.removesuffix("/v1")  # a server that answers, at a base URL without its API path
    done, _, _ = refused(tmp_path / "bare", API.format(candidate=bare, judge=instant_url))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-2] == (
        f"candidate '{bare}': {bare}/models: no model list (HTTP 404): its base_url lacks the API path: {instant_url}"
    )
