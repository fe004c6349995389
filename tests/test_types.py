"""The package type-checks: mypy over `cupid` as it installs (configured in pyproject.toml's [tool.mypy]).

The repository keeps the subpackages at its top level (`eval/` is `cupid.eval`, per [tool.setuptools.package-dir]),
which mypy cannot map by itself: it checks a tree of links that has the installed layout."""

import re
import subprocess
import sys
import tomllib

from tests.conftest import REPO


def test_the_package_passes_mypy(tmp_path):
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = tmp_path / "cupid"
    root.mkdir()
    for source in (REPO / mapping["cupid"]).glob("*.py"):
        (root / source.name).symlink_to(source)
    for package, folder in mapping.items():
        if package != "cupid":
            (tmp_path / package.replace(".", "/")).symlink_to(REPO / folder, target_is_directory=True)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "cupid", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(REPO / ".mypy_cache")],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout[-6000:] + checked.stderr[-2000:]
    found = re.search(r"Success: no issues found in (\d+) source files", checked.stdout)
    files = {f for package, folder in mapping.items() for f in (REPO / folder).glob("*.py" if package == "cupid" else "**/*.py")}
    assert found and int(found.group(1)) >= len(files), checked.stdout[-2000:]  # every module file was read (and namespace folders)
