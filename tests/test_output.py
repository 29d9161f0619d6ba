from salactl import output


def test_consoles_print_brackets_verbatim(capsys):
    """Install hints, paths and module names keep their brackets (rich markup is off), and a
    closing-tag look-alike does not raise."""
    output.stderr.print("note: no Pareto plot: matplotlib is missing (pip install 'salactl[plots]'); runs/[/x]")
    output.table("modules", ["name", "error"], [["model.layers[0].mlp[gate]", 0.5]])
    got = capsys.readouterr()
    assert "pip install 'salactl[plots]'" in got.err and "runs/[/x]" in got.err
    assert "model.layers[0].mlp[gate]" in got.out
