"""eval ppl on a text with too few tokens to score (an empty --file) is a one-line DatasetError (exit 7)
that names where the text came from and says to give a longer one."""

import pytest

from salactl.errors import DatasetError
from salactl.evaluation.perplexity import perplexity
from salactl.runtime.loader import load_model


@pytest.fixture(scope="module")
def nano():
    return load_model("sala-nano", "cpu")


@pytest.mark.parametrize("ids, bos, has, least", [([], 1, 0, 1), ([5], None, 1, 2)])
def test_too_short_text_names_its_source_and_the_fix(nano, ids, bos, has, least):
    with pytest.raises(DatasetError) as e:
        perplexity(nano.model, ids, 8, None, bos_id=bos, what="--file e.txt")
    assert str(e.value) == (f"--file e.txt is too short to score: it has {has} token(s) and needs at least "
                            f"{least}; give a longer text")
    assert e.value.exit_code == 7


def test_without_a_source_it_is_the_text(nano):
    with pytest.raises(DatasetError, match=r"^the text is too short to score: it has 0 token\(s\) and needs at "
                                           r"least 1; give a longer text$"):
        perplexity(nano.model, [], 8, None, bos_id=1)
