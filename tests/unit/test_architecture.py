"""The shape of the code (docs/architecture/index.md): stages depend on libraries, never
on each other or on the deployment; pure cores touch no Kafka, HTTP, settings or clock.

Read from the source with `ast`, so an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STAGES = (
    "gateway",
    "scheduler",
    "workers",
    "safety",
    "recorder",
    "billing",
    "analytics",
    "servertools",
)
"""Each runs as its own process (`chatpipe <stage>`), or is one (analytics' ingest)."""
LIBRARIES = (
    "schemas",
    "bus",
    "conversations",
    "ledger",
    "moderation",
    "common",
    "ops",
    "retrieval",
)
"""What more than one stage uses: event shapes, the Kafka client and stage runner, the
stores, classifiers, shared files, search over a user's documents. A library imports no
stage."""
DEPLOYMENT = "chatpipe"
"""Settings, wiring, CLI: the only package that knows every stage."""
CORES = {
    "scheduler/core.py",
    "billing/core.py",
    "recorder/core.py",
    "safety/core.py",
    "workers/core.py",
    "gateway/refusals.py",
    "gateway/native/turn_rules.py",
    "gateway/cache/rules.py",
    "servertools/core.py",
}
"""Pure cores: values in, values out; time only from an injected clock."""
IO_MODULES = (
    "aiokafka",
    "fastapi",
    "starlette",
    "httpx",
    "uvicorn",
    "time",
    "asyncio",
    "sqlite3",
    "cassandra",
    "bus",
    "chatpipe",
)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def top(module: str) -> str:
    return module.split(".", 1)[0]


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_package_is_named_here():
    """A new top-level package gets a place in the rules (and in docs/architecture/index.md)."""
    named = set(STAGES) | set(LIBRARIES) | {DEPLOYMENT, "bench", "tests"}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= named, f"unplaced packages: {packages - named}"


@pytest.mark.parametrize("package", STAGES + LIBRARIES)
def test_no_stage_or_library_imports_the_deployment(package: str):
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in package_files(package)
        for module in imports(path)
        if top(module) == DEPLOYMENT
    ]
    assert not offenders, (
        f"settings reach a stage as its own config value, built in chatpipe/wiring.py: {offenders}"
    )


@pytest.mark.parametrize("package", STAGES)
def test_no_stage_imports_another_stage(package: str):
    others = set(STAGES) - {package}
    offenders = sorted(
        {
            f"{path.relative_to(ROOT)}: {module}"
            for path in package_files(package)
            for module in imports(path)
            if top(module) in others
        }
    )
    assert not offenders, offenders


@pytest.mark.parametrize("package", LIBRARIES)
def test_no_library_imports_a_stage(package: str):
    offenders = sorted(
        {
            f"{path.relative_to(ROOT)}: {module}"
            for path in package_files(package)
            for module in imports(path)
            if top(module) in STAGES
        }
    )
    assert not offenders, offenders


def test_bench_never_imports_tests():
    offenders = sorted(
        {
            f"{path.relative_to(ROOT)}: {module}"
            for path in package_files("bench")
            for module in imports(path)
            if top(module) == "tests"
        }
    )
    assert not offenders, offenders


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_core_is_pure(core: str):
    path = ROOT / core
    assert path.exists(), f"{core} is missing"
    offenders = sorted(m for m in imports(path) if top(m) in IO_MODULES)
    assert not offenders, f"{core} imports {offenders}"


TESTS = ROOT / "tests"
CROSS_CUTTING = "project"
"""The unit tests' folder for what no one package owns: the architecture, the event
contracts, the deployment files."""


def imported_tests(path: Path) -> list[str]:
    """The test modules and conftests under tests/ that `path` imports, relative imports
    resolved, at any depth of the file."""
    package = path.relative_to(ROOT).parent.parts
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return sorted(
        module
        for module in found
        if top(module) == "tests"
        and (module.rsplit(".", 1)[-1].startswith("test_") or module.endswith(".conftest"))
    )


def test_no_test_module_imports_another():
    """Fixtures a folder's tests share live in its `conftest.py` (pytest finds them), plain
    helpers in `tests.support`; a test module or conftest is never imported."""
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in TESTS.rglob("*.py")
        for module in imported_tests(path)
    )
    assert not offenders, offenders


def test_unit_tests_mirror_the_packages():
    """`tests/unit/<package>/test_<module>.py`, each folder a package (same basenames in
    two folders); only this file sits at the top of tests/unit."""
    packages = set(STAGES) | set(LIBRARIES) | {DEPLOYMENT, "bench", CROSS_CUTTING}
    unit = TESTS / "unit"

    def placed(path: Path) -> bool:
        if path.parent == unit:
            return path.name == Path(__file__).name
        return path.relative_to(unit).parts[0] in packages

    misplaced = sorted(str(p.relative_to(ROOT)) for p in unit.rglob("test_*.py") if not placed(p))
    assert not misplaced, f"not in a folder named after a package: {misplaced}"
    folders = {path.parent for path in unit.rglob("*.py")}
    no_init = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert not no_init, f"folders without __init__.py: {no_init}"
