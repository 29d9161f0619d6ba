"""SelectionTuning: the decode selection's launch knobs, variants by name."""

import dataclasses

import pytest

from salactl.runtime.ops.selection.tuning import SelectionTuning, knob_names


def test_defaults_are_the_tuned_launch():
    assert dataclasses.asdict(SelectionTuning()) == dict(
        nbc=32, num_warps=4, lse_splits=None, dedup=True, p2_early=True, lse_bw=128, lse_elem=True, lse_warps=4,
        lse_stages=2, short_blocks=4096, gather_chunk=1024, rank_rb=32, rank_ct=256, rank_warps=8,
        rank_short_rows=4, radix_warps=8)


def test_a_variant_replaces_only_the_named_knobs():
    base = SelectionTuning()
    variant = base.with_knobs(nbc=64, dedup=False)
    assert (variant.nbc, variant.dedup) == (64, False)
    assert dataclasses.replace(variant, nbc=base.nbc, dedup=base.dedup) == base
    with pytest.raises(dataclasses.FrozenInstanceError):
        variant.nbc = 16


def test_an_unknown_knob_is_refused_by_name():
    with pytest.raises(TypeError, match=r"unknown selection knobs \['nbcc'\]; valid: .*'nbc'"):
        SelectionTuning().with_knobs(nbcc=64)
    assert knob_names()[:3] == ["nbc", "num_warps", "lse_splits"]
