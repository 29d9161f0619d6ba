"""quantize's progress reaches its total also when whole module groups stay unquantized (a down_proj
whose in_features break Marlin's rules): the counted total includes them, so they must advance it."""

from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from test_quantize_cli import small_config, write_random_checkpoint


def test_progress_ends_at_its_total_when_a_group_is_skipped(tmp_path):
    # intermediate 320: every down_proj (in 320 % 128 != 0) is skipped, a whole group of its own
    src = write_random_checkpoint(tmp_path / "src", small_config().replace(intermediate_size=320))
    seen = []
    record = quantize_checkpoint(src, tmp_path / "q", QuantOptions(method="rtn"), device="cpu",
                                 progress=lambda *a: seen.append(a))
    assert len(record["skipped"]) == 4
    total = seen[0][1]
    assert seen[0] == (0, total, "quantizing") and [d for d, _, _ in seen] == list(range(total + 1))
    assert all(t == total for _, t, _ in seen)
    assert seen[-1][2] == "layer 3: down_proj (unquantized)"
