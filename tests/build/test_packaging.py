"""The conda environment file and pyproject.toml must list the same dependencies."""

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string ('numpy>=1.24' -> 'numpy')."""
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_names() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        reqs += extra
    reqs += data["build-system"]["requires"]
    return {_name(r) for r in reqs}


def _environment_pip_names() -> set[str]:
    names, in_pip = set(), False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- pip:"):
            in_pip = True
            continue
        if in_pip and stripped.startswith("- "):
            names.add(_name(stripped[2:]))
        elif in_pip and stripped and not line.startswith(" " * 6):
            in_pip = False
    return names


def test_environment_yml_matches_pyproject():
    # The build helpers (cmake, ninja) are in environment.yml so conda users can build
    # without isolation; everything else must match one for one.
    env = _environment_pip_names() - {"cmake", "ninja"}
    assert env == _pyproject_names(), (
        f"only in environment.yml: {sorted(env - _pyproject_names())}; "
        f"only in pyproject.toml: {sorted(_pyproject_names() - env)}"
    )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
