"""Sizes in error lines read as sizes: binary units up to EiB, then three significant digits of EiB
(a 1e30-token request used to print a 26-digit count of TiB)."""

import pytest

from salactl.units import human_bytes


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (2048, "2.0 KiB"), (5 * 2**40, "5.0 TiB"), (3 * 2**50, "3.0 PiB"),
    (7 * 2**60, "7.0 EiB"), (2**80, "1.05e+06 EiB"), (1e30, "8.67e+11 EiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text
