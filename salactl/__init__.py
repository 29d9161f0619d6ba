"""salactl: quantize, run, profile and benchmark MiniCPM-SALA-class hybrid LLMs.

The Python API, imported on first use so that `import salactl` (and the CLI's start) stays cheap:

    from salactl import Engine, SamplingParams, find_tokenizer, load_model, stop_token_ids
    from salactl import GeneratedText       # stop strings on the generated text, as `run --stop`

Errors are the SalactlError subclasses in salactl.errors (UsageError for a bad argument).

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

_EXPORTS = {
    "load_model": "salactl.runtime.loader",
    "LoadedModel": "salactl.runtime.loader",
    "stop_token_ids": "salactl.runtime.loader",
    "Engine": "salactl.runtime.engine",
    "GenerationResult": "salactl.runtime.engine",
    "GPUEngine": "salactl.runtime.gpu.engine",
    "SamplingParams": "salactl.runtime.sampling",
    "Tokenizer": "salactl.runtime.tokenizer",
    "find_tokenizer": "salactl.runtime.tokenizer",
    "StreamDecoder": "salactl.runtime.stream_decoder",
    "GeneratedText": "salactl.runtime.stream_decoder",
}


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def _public_names() -> list[str]:
    """`__all__`, computed when first asked for (not at every CLI start): GPUEngine imports triton,
    so it is listed only where triton is installed."""
    return sorted(n for n in _EXPORTS if n != "GPUEngine" or _has_triton())


def __getattr__(name: str):
    if name == "__all__":
        globals()[name] = _public_names()
        return globals()[name]
    if name not in _EXPORTS:
        raise AttributeError(f"module 'salactl' has no attribute {name!r}")
    if name == "GPUEngine" and not _has_triton():
        raise ModuleNotFoundError("GPUEngine needs triton (pip install 'salactl[gpu]' on a CUDA machine); "
                                  "Engine runs anywhere", name="triton")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))
