"""The wheel must hold every sub-package: pytest imports the checkout, which hides a missing one."""

from __future__ import annotations

import sys
from pathlib import Path

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
