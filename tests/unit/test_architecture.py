"""The shape of the code (README: *What runs where*): stages depend on libraries, never
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
    """A new top-level package gets a place in the rules (and in the README)."""
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
