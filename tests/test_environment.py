"""environment.yml (conda, clusters) and pyproject.toml (pip) declare the same dependencies.

Every runtime dependency of pyproject.toml and every dev extra is in environment.yml with a bound
at least as strict on each side, and environment.yml asks for nothing that pyproject.toml lacks, so
the two cannot drift apart silently.
"""

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
# conda-forge's name of a pip package, where they differ (matplotlib-base: matplotlib without a GUI toolkit).
CONDA_NAMES = {"matplotlib": "matplotlib-base"}
CONDA_ONLY = {"python", "pip"}  # the interpreter and installer themselves


def normalise(name: str) -> str:
    """PEP 503 name: lower case, runs of '-', '_', '.' as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_requirements() -> dict[str, SpecifierSet]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]
    return {normalise(CONDA_NAMES.get(r.name, r.name)): r.specifier for r in map(Requirement, specs)}


def conda_requirements() -> dict[str, SpecifierSet]:
    """environment.yml's conda and pip dependencies (conda's ``name=1.2`` read as ``name==1.2.*``)."""
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    specs = [d for d in deps if isinstance(d, str)]
    specs += [d for block in deps if isinstance(block, dict) for d in block.get("pip", []) if not d.startswith("-")]
    found = {}
    for spec in specs:
        spec = re.sub(r"(?<![<>=!~])=(?!=)([\w.]+)", r"==\1.*", spec.split("::")[-1])
        requirement = Requirement(spec)
        found[normalise(requirement.name)] = requirement.specifier
    return found


def at_least_as_strict(env: SpecifierSet, project: SpecifierSet) -> bool:
    """Whether every lower and upper bound of ``project`` is met by a bound of ``env`` as strict."""

    def bounds(specs, ops):
        return [Version(s.version.rstrip(".*")) for s in specs if s.operator in ops]

    for clause in project:
        version = Version(clause.version.rstrip(".*"))
        if clause.operator in (">=", ">", "~="):
            ok = any(v >= version for v in bounds(env, (">=", ">", "==", "~=")))
        elif clause.operator in ("<", "<="):
            ok = any(v <= version for v in bounds(env, ("<", "<="))) or any(v < version for v in bounds(env, ("==",)))
        else:  # == or !=: the same clause
            ok = clause in env
        if not ok:
            return False
    return True


def test_every_pyproject_dependency_is_in_environment_yml_with_a_compatible_bound():
    conda = conda_requirements()
    for name, spec in pyproject_requirements().items():
        assert name in conda, f"pyproject.toml needs {name}{spec}; add it to environment.yml"
        assert at_least_as_strict(conda[name], spec), (
            f"environment.yml asks for {name}{conda[name]}, which allows versions pyproject.toml's "
            f"{name}{spec} does not"
        )


def test_environment_yml_asks_for_nothing_pyproject_lacks():
    extra = set(conda_requirements()) - set(pyproject_requirements()) - CONDA_ONLY
    assert not extra, f"environment.yml has {sorted(extra)}, which pyproject.toml does not declare"


def test_environment_python_satisfies_requires_python():
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    python = conda_requirements()["python"]
    (pin,) = [s.version.rstrip(".*") for s in python if s.operator == "=="]
    assert Version(pin) in requires


@pytest.mark.parametrize(
    "env, project, ok",
    [
        (">=2.4,<2.5", ">=2.4,<2.5", True),
        (">=2.5", ">=2.4", True),
        (">=2.3", ">=2.4", False),  # allows 2.3
        (">=2.4", ">=2.4,<2.5", False),  # no upper bound
        (">=2.4,<3", ">=2.4,<2.5", False),  # allows 2.6
        ("==2.4.1", ">=2.4,<2.5", True),
        ("", "", True),
    ],
)
def test_bounds_comparison(env, project, ok):
    assert at_least_as_strict(SpecifierSet(env), SpecifierSet(project)) is ok
