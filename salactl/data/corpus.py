"""The sala-nano corpus: Python standard library source of the running interpreter.

Origin and license: the `.py` files the interpreter ships in its stdlib directory (Python Software
Foundation License), so every machine with Python can rebuild the corpus offline. Rules (fixed, so a
rebuild is deterministic):
- files are visited in sorted POSIX relative-path order; bytes are decoded as UTF-8 (invalid bytes
  replaced) and CRLF/CR are normalised to LF;
- directories that distributions split into optional packages (tkinter, idlelib, lib2to3, ensurepip,
  ...), test suites, third-party site-packages, codec tables and platform-generated files are left
  out, so the same module set exists on 3.10-3.13 installs (Debian/Ubuntu included);
- a file belongs to the held-out split iff sha256(relative path) mod 32 == 0 (about 3% of files),
  independent of the file's content, so a module never moves between splits across versions;
- each document is `# <relative path>\\n<text>\\n`, documents joined by a blank line.

The *content* of stdlib modules changes between CPython minor versions, so the corpus text (and its
sha256) is per interpreter version; `RECORDED_SHA256` holds the hashes seen for each version.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from functools import lru_cache
from pathlib import Path

from salactl.errors import DatasetError

SPLITS = ("train", "heldout")
HELDOUT_MODULUS = 32
DOC_SEPARATOR = "\n"
_EXCLUDED_PARTS = {
    "site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "idlelib",
    "tkinter", "turtledemo", "lib2to3", "distutils", "ensurepip", "encodings", "lib-dynload",
    "__phello__",
}
_EXCLUDED_FILES = {"turtle.py", "__hello__.py", "antigravity.py", "this.py"}

# sha256 of corpus_text(split) per interpreter version (stdlib content differs even between patch
# releases and distribution builds); recorded from real builds, see BENCHMARKS.md.
RECORDED_SHA256: dict[str, dict[str, str]] = {
    "3.11.7": {  # pyenv CPython, the development/CI machine
        "train": "00cf2ab8086a9ae890147f438b5e81b0c644dbcf1c8f3ca07e6dbc5bac3530b6",
        "heldout": "ea5ef1376f8573903edcce93dec4ff7c2d079a2f650784858a837c6cfbd41381",
    },
    "3.12.3": {  # Ubuntu CPython on the H200 machine that trained sala-nano
        "train": "9f341e1a5d2ab3e76f1a96a54e668df8b8daf6647d96f6dd7b2c1001de8402d1",
        "heldout": "35cd184f50ef42b3e270e2b18cec6c8272467c2874d0648db3e0457fd89ed7d9",
    },
}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _included(rel: Path) -> bool:
    parts = rel.parts
    if any(p in _EXCLUDED_PARTS or p.startswith("config-") for p in parts[:-1]):
        return False
    name = parts[-1]
    return not (name in _EXCLUDED_FILES or name.startswith("_sysconfigdata"))


def split_of(relpath: str) -> str:
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_MODULUS == 0 else "train"


def source_files() -> list[tuple[str, Path]]:
    root = stdlib_dir()
    if not root.is_dir():
        raise DatasetError(f"the Python standard library directory {root} does not exist; "
                           "the corpus is built from it")
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if _included(rel) and path.is_file():
            files.append((rel.as_posix(), path))
    return sorted(files)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DatasetError(f"unknown corpus split {split!r}; valid splits: {', '.join(SPLITS)}")


@lru_cache(maxsize=4)
def corpus_documents(split: str) -> tuple[str, ...]:
    """The split's documents in order (each `# <relpath>\\n<text>\\n`)."""
    _check_split(split)
    docs = []
    for rel, path in source_files():
        if split_of(rel) != split:
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        text = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
        docs.append(f"# {rel}\n{text}\n")
    if not docs:
        raise DatasetError(f"the {split} corpus split is empty: no stdlib sources under {stdlib_dir()}")
    return tuple(docs)


def corpus_text(split: str) -> str:
    return DOC_SEPARATOR.join(corpus_documents(split))


def corpus_sha256(split: str) -> str:
    return hashlib.sha256(corpus_text(split).encode("utf-8")).hexdigest()


def python_version() -> str:
    return platform.python_version()


def recorded_sha256(split: str) -> str | None:
    return RECORDED_SHA256.get(python_version(), {}).get(split)
