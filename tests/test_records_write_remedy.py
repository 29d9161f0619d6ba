"""A records append that fails says what to do by the reason it failed: free space only when the
disk is full, a read-only file system is not a space problem (real tmpfs mounts; root only)."""

import errno
import os
import subprocess

import pytest

from salactl.bench.records import RecordWriter
from salactl.errors import OutputWriteError
from salactl.reports.atomic import write_remedy


def test_a_read_only_file_system_asks_for_a_writable_place_not_free_space(tmpfs):
    tmpfs = tmpfs("64k")
    path = tmpfs / "records.jsonl"
    path.write_text('{"phase": "S1"}\n')
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.raises(OutputWriteError) as e:
        RecordWriter(path).append({"phase": "S8"})
    assert "Read-only file system; make it writable or choose another --out" in str(e.value)
    assert "free space" not in str(e.value)
    assert path.read_text() == '{"phase": "S1"}\n'


def test_a_full_disk_asks_for_free_space_and_leaves_the_file_as_it_was(tmpfs):
    tmpfs = tmpfs("64k")
    (tmpfs / "filler").write_bytes(b"\0" * (60 << 10))
    path = tmpfs / "records.jsonl"
    path.write_text('{"phase": "S1"}\n')
    with pytest.raises(OutputWriteError) as e:
        RecordWriter(path).extend([{"phase": "S8", "pad": "x" * 4096}] * 4)
    assert "No space left on device; free space on its disk or choose another --out" in str(e.value)
    assert path.read_text() == '{"phase": "S1"}\n'


@pytest.mark.parametrize("code,want", [(errno.ENOSPC, "free space on its disk or choose another --out"),
                                       (errno.EDQUOT, "free space on its disk or choose another --out"),
                                       (errno.EFBIG, "(ulimit -f); choose another --out"),
                                       (errno.EACCES, "make it writable or choose another --out"),
                                       (errno.EIO, "choose another --out")])
def test_the_remedy_follows_the_errno(code, want):
    got = write_remedy(OSError(code, os.strerror(code)))
    assert got.endswith(want) and (("free space" in got) == (code in (errno.ENOSPC, errno.EDQUOT)))
