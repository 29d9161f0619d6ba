"""salactl: quantize, run, profile and benchmark MiniCPM-SALA-class hybrid LLMs.

The design card keeps runtime/, quant/, reports/ and profiles/ at the repository's top level;
pyproject maps them to salactl.runtime etc. When this package is imported from a source checkout
(e.g. `python -m salactl` or pytest run from the repo root, where ./salactl shadows the installed
package), the checkout root is added to __path__ so those sub-packages resolve the same way.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").exists() and (_root / "runtime" / "__init__.py").exists():
    __path__.append(str(_root))  # noqa: F821 - __path__ is defined for packages
del _Path, _root
