"""Quantization defaults the CLI shows in its help: kept free of torch so that `salactl --help`
starts without importing it."""

DEFAULT_DAMP = 0.01
