"""An empty or blank endpoint is a usage error, in the CLI (its option parser) and in BenchSettings
alike: it used to benchmark the embedded runtime instead, as if no endpoint were given."""

import pytest

from conftest import run_cli
from salactl.bench.job import BenchSettings, run_bench
from salactl.errors import UsageError

MESSAGE = "--endpoint is empty; give a server URL, or leave it out for the embedded runtime"
TINY = dict(profile="decode", scale=0.01, phases=("decode-bs1",), random_weights=True, device="cpu",
            engine="reference")       # a run of seconds, were the endpoint taken as absent


@pytest.mark.parametrize("endpoint", ["", " "])
def test_bench_settings_refuse_an_empty_endpoint(tmp_path, endpoint):
    with pytest.raises(UsageError, match=f"^{MESSAGE}$"):
        run_bench(BenchSettings(endpoint=endpoint, out=tmp_path / "b", **TINY))
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("endpoint", ["", " "])
def test_bench_cli_refuses_an_empty_endpoint(tmp_path, capsys, endpoint):
    code, _, err = run_cli(["bench", "--endpoint", endpoint, "--out", tmp_path / "b"], capsys)
    assert code == 2 and err.strip() == f"error: {MESSAGE}", err
