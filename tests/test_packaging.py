"""The wheel must hold every sub-package and its data files (the embedded sala-nano, the profile
TOMLs): pytest imports the checkout, which hides a missing one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    on_disk = set()
    for name, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    missing = {p for p in listed if not _folder(p, tool["package-dir"]).is_dir()}
    assert missing == set(), "these listed packages have no folder"


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    head = max((n for n in package_dir if package == n or package.startswith(n + ".")), key=len)
    return ROOT / package_dir[head] / Path(*package[len(head) + 1:].split(".")) if package != head else ROOT / package_dir[head]


def test_cli_module_imports_every_subcommand():
    from salactl.cli import app

    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert {"run", "info", "eval", "quantize", "bench", "sweep", "profile", "report"} <= names


def _can_build_offline() -> bool:
    """--no-build-isolation uses this environment's setuptools: pyproject's build-system (an SPDX
    `license` string) needs >= 77."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("setuptools").split(".")[:2]) >= (77, 0)
    except (PackageNotFoundError, ValueError):
        return False


def _sources(tmp_path: Path, tool: dict, tests: bool = False) -> Path:
    """A copy of what a build reads, so no build/ or egg-info lands in the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in") + (("BENCHMARKS.md",) if tests else ()):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in set(tool["package-dir"].values()) | (set(SDIST_FOLDERS) | {"docs"} if tests else set()):
        shutil.copytree(ROOT / folder, src / folder, ignore=skip)
    return src


# what the sdist's tests read besides the package: their helpers and fixtures, and the benchmark
# scripts and tools whose argument checks they run
SDIST_FOLDERS = ("tests", "benchmarks", "tools")


def test_the_wheel_holds_every_module_and_the_package_data(tmp_path):
    """Build the wheel (about 3 s) from a copy of the sources, so no build/ or egg-info lands in
    the checkout, and look for every module and data file the checkout has."""
    if not _can_build_offline():
        pytest.skip("needs setuptools >= 77 in this environment")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    src = _sources(tmp_path, tool)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp_path / "whl").glob("salactl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    def in_wheel(package: str, file: Path) -> str:
        return "/".join([*package.split("."), file.name])

    want = {in_wheel(pkg, f) for pkg in tool["packages"]
            for f in _folder(pkg, tool["package-dir"]).glob("*.py")}
    nano = sorted((ROOT / "runtime" / "models" / "sala-nano").iterdir())
    tomls = sorted((ROOT / "profiles").glob("*.toml"))
    assert {f.name for f in nano} >= {"config.json", "tokenizer.json", "model.safetensors.index.json"} and tomls
    want |= {f"salactl/runtime/models/sala-nano/{f.name}" for f in nano}
    want |= {f"salactl/profiles/{f.name}" for f in tomls}
    assert want - names == set(), "declare these in pyproject.toml (packages / package-data)"
    assert "salactl-0.1.0.dist-info/licenses/LICENSE" in names, "Apache-2.0 asks that its text go with the code"


def test_the_sdist_holds_a_test_suite_that_runs(tmp_path):
    """The sdist's tests need their helpers and fixtures (conftest.py, the loopback bench server, the
    Nsight Compute CSVs) and the benchmark scripts and tools they run, which setuptools leaves out
    unless MANIFEST.in grafts them; two of those tests then run from the unpacked sdist."""
    if not _can_build_offline():
        pytest.skip("needs setuptools >= 77 in this environment")
    import tarfile

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    src = _sources(tmp_path, tool, tests=True)
    build = "import setuptools.build_meta as b, sys; print(b.build_sdist(sys.argv[1]))"
    p = subprocess.run([sys.executable, "-c", build, str(tmp_path / "sdist")], cwd=src, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    names = {n.split("/", 1)[1] for n in tarfile.open(tmp_path / "sdist" / p.stdout.split()[-1]).getnames()
             if "/" in n}
    want = {f.relative_to(ROOT).as_posix() for folder in SDIST_FOLDERS for f in (ROOT / folder).rglob("*")
            if f.is_file() and "__pycache__" not in f.parts}
    assert {"tests/conftest.py", "tests/bench_server.py", "LICENSE", "docs/reference.md"} <= names
    assert want - names == set()
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    with tarfile.open(tmp_path / "sdist" / p.stdout.split()[-1]) as sdist:
        sdist.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    # one test reads benchmarks/ through sys.path, the other tools/ beside its tests folder
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_bench_streaming_fit.py", "tests/test_tokenizer_fidelity.py", "-k",
                          "fit or hf_llama_fast"], cwd=unpacked, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
