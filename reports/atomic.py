"""Write several output files all-or-nothing: every file goes to a temp name in its directory
first, and only when all are written are they renamed into place."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(files: dict[Path, str | bytes]) -> list[Path]:
    temps: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            if isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data, encoding="utf-8")
            temps.append((tmp, path))
    except BaseException:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in temps:
        os.replace(tmp, path)
    return [p for _, p in temps]
