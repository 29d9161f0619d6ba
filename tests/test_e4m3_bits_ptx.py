"""The decode-attention kernel's e4m3 -> fp16 inline PTX (`_E4M3_F16_ASM`), run instruction by
instruction by a small emulator of the four PTX instructions it uses, on every e4m3 byte: the
interpreter cannot run inline PTX, so without this only a GPU would catch a wrong selector or LUT."""

import importlib.util
import re

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
M32 = 0xFFFFFFFF


def _lop3(a, b, c, lut):
    """PTX lop3.b32: bit i of the result is bit (a_i·4 + b_i·2 + c_i) of the LUT."""
    return sum(((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i
               for i in range(32))


def _prmt(a, b, sel):
    """PTX prmt.b32 (default mode): result byte j is byte sel[4j+3:4j] of {b, a} (a = bytes 0-3)."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    assert all(((sel >> (4 * j)) & 0x8) == 0 for j in range(4)), "sign-replicating selectors not emulated"
    return sum(src[(sel >> (4 * j)) & 0x7] << (8 * j) for j in range(4))


def _run(ptx: str, inputs: dict) -> dict:
    regs = dict(inputs)

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    for line in ptx.splitlines():
        m = re.match(r"\s*(\w+)\.b32\s+([^;]+);", line)
        if not m:
            continue
        op, args = m.group(1), [t.strip() for t in m.group(2).split(",")]
        x = [val(t) for t in args[1:]]
        regs[args[0]] = {"prmt": lambda: _prmt(*x), "and": lambda: x[0] & x[1], "shr": lambda: (x[0] & M32) >> x[1],
                         "lop3": lambda: _lop3(*x)}[op]() & M32
    return regs


def test_e4m3_bit_moves_give_every_byte_times_2_to_the_minus_8():
    from salactl.runtime.ops.decode_attention.triton import _E4M3_F16_ASM, E4M3_BITS_SCALE

    ptx = getattr(_E4M3_F16_ASM, "value", _E4M3_F16_ASM)
    scale = float(getattr(E4M3_BITS_SCALE, "value", E4M3_BITS_SCALE))
    byte = torch.arange(256, dtype=torch.uint8)
    ref = byte.view(torch.float8_e4m3fn).float()
    got = torch.empty(256)
    for w0 in range(0, 256, 4):
        word = sum((w0 + k) << (8 * k) for k in range(4))
        r = _run(ptx, {"$2": word})
        halves = [r["$0"] & 0xFFFF, r["$0"] >> 16, r["$1"] & 0xFFFF, r["$1"] >> 16]
        got[w0:w0 + 4] = torch.from_numpy(np.array(halves, dtype=np.uint16).view(np.float16).astype(np.float32))
    finite = ref.isfinite()                       # 0x7F / 0xFF are NaN in e4m3fn: never written by store_kv
    assert torch.equal(got[finite] * scale, ref[finite])
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))    # -0.0 stays -0.0
