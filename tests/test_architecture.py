"""The code's shape: no import cycles, a paper-neutral core, and every paper in its own folder."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import networkx as nx

import analysis
import moe_core

CORE = Path(moe_core.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages([str(CORE)], prefix="moe_core."))
# The core modules that import moe_core.papers: the registry of papers and the schema root that
# assembles their config sections.
REGISTRIES = {"moe_core.config.load"}


def test_every_module_imports_alone_in_sorted_order():
    """Each module is imported first in a fresh module table (moe_core.* dropped in between), so an
    import cycle that only bites when some module is imported first cannot hide."""
    script = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'moe_core' or m.startswith('moe_core.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert len(MODULES) > 30 and "moe_core.papers.lina.policy" in MODULES


def _imports(path: Path, module: str, top: str = "moe_core") -> set[str]:
    """Absolute names of the ``top`` package's modules ``path`` (module ``module``) imports, at any
    depth of the file (a function's imports too)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {n for n in names if n.split(".")[0] == top}


def test_the_core_never_imports_a_paper_except_through_the_registry():
    for path in sorted(CORE.rglob("*.py")):
        module = ".".join(path.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith("moe_core.papers") or module in REGISTRIES:
            continue
        assert not any(name.startswith("moe_core.papers") for name in _imports(path, module)), module


def test_the_core_never_imports_the_entry_points():
    """moe_core is the library the entry points (experiments/) run: a paper's study lives in its folder
    and the entry point only writes its records, never the other way round."""
    for path in sorted(CORE.rglob("*.py")):
        module = ".".join(path.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        assert not _imports(path, module, top="experiments"), module


def _import_graph(package: Path) -> nx.DiGraph:
    """module -> module it imports, within ``package``; importing a module runs its packages'
    __init__ first, so an import also reaches each package above the imported module."""
    top = package.name
    files = {
        ".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package.rglob("*.py")
    }
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        for name in _imports(path, module, top):
            parts = name.split(".")
            for depth in range(2, len(parts) + 1):
                target = ".".join(parts[:depth])
                if target in files and target != module and not module.startswith(target + "."):
                    graph.add_edge(module, target)
    return graph


def test_the_core_has_no_import_cycle():
    """Papers, run checks and the simulator derive configs with moe_core.schema.derive, which imports no
    paper; only moe_core.config.load, the loader, imports the papers' registry."""
    graph = _import_graph(CORE)
    assert graph.has_edge("moe_core.config.load", "moe_core.papers")
    assert graph.has_edge("moe_core.papers.axonn.sweeps", "moe_core.schema.derive")
    assert list(nx.simple_cycles(graph)) == []


def package_graph(modules: nx.DiGraph) -> nx.DiGraph:
    """A tree's packages (a module at its top counts as one) -> the packages they import, from
    the module graph: an import of any kind (at a module's top, in a function, for registration)."""
    package = lambda module: module.split(".")[1]  # noqa: E731
    graph = nx.DiGraph()
    graph.add_nodes_from(package(m) for m in modules if "." in m)
    graph.add_edges_from((package(a), package(b)) for a, b in modules.edges if package(a) != package(b))
    return graph


def test_the_core_packages_stack():
    """No import cycle between moe_core's packages: each reads knowing only the ones below it
    (moe_core/__init__.py lists the floors). The loader sits on top; the host, the registry and
    the units at the bottom import no other package."""
    graph = package_graph(_import_graph(CORE))
    assert {"host", "model", "dispatch", "schema", "sim", "papers", "config"} <= set(graph)
    assert nx.is_directed_acyclic_graph(graph), nx.find_cycle(graph)
    assert {name for name in graph if graph.out_degree(name) == 0} == {"host", "registry", "units"}
    assert {name for name in graph if graph.in_degree(name) == 0} == {"config"}


def test_the_package_check_sees_a_cycle_closed_inside_a_function(tmp_path):
    """An import inside a function counts: a floor that imports a higher one only there closes a cycle."""
    files = {"low/mod.py": "def f():\n    from pkg.high.mod import g\n", "high/mod.py": "from pkg.low.mod import f\n"}
    for name in ("__init__.py", "low/__init__.py", "high/__init__.py", *files):
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files.get(name, ""))
    assert not nx.is_directed_acyclic_graph(package_graph(_import_graph(tmp_path / "pkg")))


def test_the_analysis_has_no_import_cycle():
    """Registration is explicit (analysis.registry, filled when a command imports analysis.papers):
    no module of analysis/ imports one that imports it back."""
    graph = _import_graph(Path(analysis.__file__).parent)
    assert {"analysis.registry", "analysis.compare", "analysis.papers.lina"} <= set(graph)
    assert graph.has_edge("analysis.compare", "analysis.papers")
    assert list(nx.simple_cycles(graph)) == []


def test_papers_import_no_other_paper():
    papers = [p for p in (CORE / "papers").iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert {p.name for p in papers} >= {"gshard", "lina", "aurora"}
    for paper in papers:
        for path in sorted(paper.rglob("*.py")):
            module = ".".join(path.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
            others = {n for n in _imports(path, module) if n.startswith("moe_core.papers.")}
            assert all(n.startswith(f"moe_core.papers.{paper.name}") for n in others), (module, others)


def test_configs_load_and_the_analysis_runs_without_torch():
    """The workflow, the launcher and the analysis load and validate configs without importing torch
    (seconds per job): the policy registry names measured executors instead of importing them, and
    the analysis's jobs (a few seconds each, some thirty per run) read records without the simulator."""
    analysis = sorted(p.stem for p in (CORE.parent / "analysis").glob("*.py") if p.stem != "__init__")
    script = (
        "import sys, importlib, moe_core.config.load, moe_core.schema.points, experiments.launch\n"
        f"for name in {analysis!r}: importlib.import_module('analysis.' + name)\n"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_shared_training_step_and_simulation_name_no_paper():
    """The training loop and the simulation entry point reach a paper's mechanisms only through the
    plan (a policy's executor, a re-layout hook's driver): they import no paper."""
    for module in ("train_step", "simulate"):
        path = CORE.parent / "experiments" / f"{module}.py"
        imported = _imports(path, f"experiments.{module}")
        assert not any(n.startswith("moe_core.papers") for n in imported), (module, sorted(imported))
