"""`pip install cupid-eval` as a user meets it: the built wheel, installed with no dependencies into a fresh virtual
environment whose only other packages are this one's (a `.pth` line: the fresh environment sees them as its own,
without this environment's editable checkout), run from an empty directory with CUPID_HOME set. Each command exits 0
without a traceback, and every file it writes lies under CUPID_HOME or the --out it was given.

The full install (`pip install cupid-eval[cpu]` from the package index, then `cupid demo`) is `make check-install`:
it downloads gigabytes, so it is no part of the suite."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from cupid.serving.servers import tiny_model
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # a wheel built and installed (~20 s before any test): `make test` runs it


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh environment with the wheel in it; its `bin/`."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp.glob("cupid_eval-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "Name: cupid-eval" in metadata
    for extra in ("cpu", "gpu", "train", "track", "inspect"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "cupid = cupid.__main__:main" in entry_points and "[inspect_ai]\ncupid = " in entry_points
    fresh = tmp / "env"
    venv.EnvBuilder(with_pip=False).create(fresh)
    purelib = Path(
        subprocess.run(
            [str(fresh / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    (purelib / "layered.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # this environment's packages
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(fresh / "bin" / "python"), "install", "--no-deps", "-q",
         str(wheel)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return fresh / "bin"


def test_the_installed_command_writes_only_under_cupid_home_and_out(installed, tmp_path, smol_model_dir):
    home, work, out = tmp_path / "home", tmp_path / "work", tmp_path / "out"
    work.mkdir()
    converted = home / "models" / tiny_model.DIR_NAME  # the conversion (~40 s of a core), as prepare-tiny left it
    converted.mkdir(parents=True)
    for f in smol_model_dir.iterdir():
        (converted / f.name).symlink_to(f)
    # vLLM's own argument defaults, read from its parser (~10 s), are kept per vLLM release in the user's cache
    # (`serving.servers.vllm_args`): not state, shared by every CUPID_HOME; the one place written beside the two.
    xdg = tmp_path / "xdg"
    env = {"PATH": f"{installed}:/usr/bin:/bin", "CUPID_HOME": str(home), "HOME": str(tmp_path / "user"),
           "XDG_CACHE_HOME": str(xdg), "COLUMNS": "200"}  # fmt: skip

    def cupid(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(installed / "cupid"), *args], cwd=work, env=env, capture_output=True, text=True, timeout=600,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        return done

    where = subprocess.run(
        [str(installed / "python"), "-c", "import cupid; print(cupid.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(installed.parent)), where.stdout  # the wheel's, not the checkout's
    assert cupid("--version").stdout.strip() == "cupid 0.1.0"
    assert cupid("serve", "prepare-tiny").stdout.strip() == str(converted)
    demo = cupid("demo", "--dry-run", "--out", str(out / "demo"))
    assert str(converted) in demo.stderr
    cupid("train", "grpo", "--config", "configs/train/grpo-tiny.yaml", "--dry-run")
    cupid("doctor")
    assert not list(work.iterdir())
    written = [p for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()]
    allowed = (home, out, xdg / "cupid" / "vllm-args")
    assert written and all(any(p.is_relative_to(place) for place in allowed) for p in written), written


HIDDEN = """import sys
class Missing:  # trl, as an install without the [train] extra has it: not there
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "trl":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
from cupid.cli import app
sys.argv[0] = "cupid"
app()
"""


def test_a_wheel_install_is_told_the_extra_by_name_and_doctor_fix_leaves_it_sound(installed, tmp_path):
    """A pip user has no checkout: a missing extra is `pip install 'cupid-eval[X]'`. What the package index leaves
    beside a CPU torch (a CUDA torchvision) is found by `cupid doctor` (exit 1) and taken out by `--fix`, which has
    nothing to do a second time."""
    work, env = tmp_path / "work", {"PATH": f"{installed}:/usr/bin:/bin", "CUPID_HOME": str(tmp_path / "home")}
    work.mkdir()
    (work / "hidden.py").write_text(HIDDEN)
    args = ["train", "run", "--config", "configs/train/tiny.yaml", "--dry-run"]
    refused = subprocess.run([str(installed / "python"), "hidden.py", *args], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300, check=False)  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: this command needs trl, which the [train] extra installs: pip install 'cupid-eval[train]'"
    )

    purelib = Path(
        subprocess.run([str(installed / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       capture_output=True, text=True, check=True).stdout.strip()
    )  # fmt: skip
    (purelib / "torchvision").mkdir()
    (purelib / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")'
    )
    info = purelib / "torchvision-0.28.0.dist-info"  # the index's build label, not the CPU torch's `+cpu`
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    (info / "RECORD").write_text(
        "torchvision/__init__.py,,\ntorchvision-0.28.0.dist-info/METADATA,,\ntorchvision-0.28.0.dist-info/RECORD,,\n"
    )

    def doctor(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(installed / "cupid"), "doctor", *flags], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip

    broken = doctor()
    assert broken.returncode == 1 and "pip uninstall -y torchvision" in broken.stdout, broken.stdout + broken.stderr
    fixed = doctor("--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "fix: pip uninstall -y torchvision" in fixed.stdout and fixed.stdout.strip().endswith("ok: nothing broken")
    assert not (purelib / "torchvision").exists()
    again = doctor("--fix")
    assert again.returncode == 0 and "fix:" not in again.stdout, again.stdout + again.stderr
