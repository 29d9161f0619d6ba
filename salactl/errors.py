"""Known failure modes: each has a one-line message (what is wrong + how to fix it) and its own exit code."""


class SalactlError(Exception):
    exit_code = 1


class UsageError(SalactlError):
    exit_code = 2


class ConfigError(SalactlError):
    exit_code = 3


class CheckpointError(SalactlError):
    exit_code = 4


class TokenizerError(SalactlError):
    exit_code = 5


class DeviceError(SalactlError):
    exit_code = 6


class DatasetError(SalactlError):
    exit_code = 7


class EndpointError(SalactlError):
    exit_code = 8


class QuantizationError(SalactlError):
    exit_code = 9


class OutputExistsError(SalactlError):
    exit_code = 10


class CapacityError(SalactlError):
    exit_code = 11


class ToolMissingError(SalactlError):
    exit_code = 12


class ProfilerPermissionError(SalactlError):
    exit_code = 13


class ProfilerFailedError(SalactlError):
    exit_code = 14


class AllTokensBannedError(UsageError):
    """A request's logits processors banned every token (no_repeat_ngram_size with min_new_tokens
    over a small vocabulary, say): its settings conflict, the model is fine (NaN/Inf logits are a
    NumericsError)."""


class NumericsError(SalactlError):
    """The model computed NaN/Inf logits: broken weights, or a dtype whose range overflowed."""
    exit_code = 15


class OutputWriteError(SalactlError):
    """An output could not be written (disk full, a file-size limit, a read-only file). A file's
    write is taken back, so no partial file is left; what stdout already took stays there."""
    exit_code = 16


class ModelLimitWarning(UserWarning):
    """A request the Python engines run but should flag: past the model's trained length, or
    sparse settings where the forced blocks fill the top-k. The CLI ignores it (it says the same
    with the flag to change)."""
