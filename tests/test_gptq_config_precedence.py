"""Which quantization_config key names a GPTQ checkpoint's format, and `sym`, read as vLLM and SGLang
read them, loading a real RTN checkpoint of sala-nano (v1 `gptq`: symmetric qzeros 0x77777777):
- vLLM's and SGLang's GPTQ configs read `checkpoint_format` only; `format` is GPTQModel's name for
  it, our fallback where `checkpoint_format` is missing. Where both are present and disagree,
  `checkpoint_format` decides, as it does in the engines that will serve the checkpoint;
- `sym: false` is refused even where the qzeros happen to be symmetric: Marlin runs sym only."""

import pytest
import torch

from salactl.errors import CheckpointError
from salactl.runtime.loader import load_model
from test_checkpoint_variants import edit_config, logits
from test_gptq_config_parsing_more import variant

V2_WORD = "0x88888888"


def test_checkpoint_format_wins_over_format(nano_rtn_dir, tmp_path):
    path = variant(nano_rtn_dir, tmp_path / "v1", checkpoint_format="gptq", format="gptq_v2")
    torch.testing.assert_close(logits(path), logits(nano_rtn_dir), rtol=0, atol=0)


def test_a_gptq_v2_checkpoint_format_is_not_overridden_by_format(nano_rtn_dir, tmp_path):
    path = variant(nano_rtn_dir, tmp_path / "v2", checkpoint_format="gptq_v2", format="gptq")
    with pytest.raises(CheckpointError, match=f"not the symmetric value {V2_WORD} for 4-bit gptq_v2"):
        load_model(path, "cpu", "float32")


def test_format_alone_is_read_where_checkpoint_format_is_missing(nano_rtn_dir, tmp_path):
    path = edit_config(variant(nano_rtn_dir, tmp_path / "fmt", format="gptq_v2"),
                       lambda d: d["quantization_config"].pop("checkpoint_format"))
    with pytest.raises(CheckpointError, match=f"not the symmetric value {V2_WORD}"):
        load_model(path, "cpu", "float32")


def test_sym_false_is_refused_even_with_symmetric_qzeros(nano_rtn_dir, tmp_path):
    path = variant(nano_rtn_dir, tmp_path / "asym", sym=False)
    with pytest.raises(CheckpointError, match=r"asymmetric GPTQ \(sym=false\) is not supported"):
        load_model(path, "cpu", "float32")
