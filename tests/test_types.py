"""The package, the bench and the scripts type-check: mypy over `cupid` as it installs, `bench` and `scripts/*.py`
(configured in pyproject.toml's [tool.mypy]). The bench and the scripts run only by hand (`make bench`, a GPU
box), so no other test would notice a call into the package that no longer fits it.

The repository keeps the subpackages at its top level (`eval/` is `cupid.eval`, per [tool.setuptools.package-dir]),
which mypy cannot map by itself: it checks a tree of links that has the installed layout, with `bench` and `tests`
beside `cupid` as they are beside it when `python -m bench.run` runs from the repository (bench/view.py imports
tests/run_records.py), and each script a top-level module, as `python scripts/x.py` runs it."""

import os
import re
import subprocess
import sys
import tomllib

from tests.helpers import REPO


def test_the_package_the_bench_and_the_scripts_pass_mypy(tmp_path):
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = tmp_path / "cupid"
    root.mkdir()
    for source in (REPO / mapping["cupid"]).glob("*.py"):
        (root / source.name).symlink_to(source)
    for package, folder in mapping.items():
        if package != "cupid":
            (tmp_path / package.replace(".", "/")).symlink_to(REPO / folder, target_is_directory=True)
    for folder in ("bench", "tests"):
        (tmp_path / folder).symlink_to(REPO / folder, target_is_directory=True)
    scripts = sorted((REPO / "scripts").glob("*.py"))
    modules = ["-p", "cupid", "-p", "bench", *(arg for script in scripts for arg in ("-m", script.stem))]
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            *modules,
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(REPO / ".mypy_cache"),
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(REPO / "scripts")},  # the scripts, as top-level modules
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout[-6000:] + checked.stderr[-2000:]
    found = re.search(r"Success: no issues found in (\d+) source files", checked.stdout)
    files = {
        f
        for package, folder in mapping.items()
        for f in (REPO / folder).glob("*.py" if package == "cupid" else "**/*.py")
    }
    files |= {*(REPO / "bench").glob("*.py"), *scripts}
    # Every module file was read (and namespace folders): the bench and each script too.
    assert scripts and found and int(found.group(1)) >= len(files), checked.stdout[-2000:]
