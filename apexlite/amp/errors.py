"""Exception types raised by apexlite.amp (subclassing the types apex raised, so old handlers still work)."""


class AmpConfigError(RuntimeError, ValueError):
    """An `initialize` option or a combination of options is invalid."""


class AmpStateError(RuntimeError):
    """An amp call was made in the wrong order (before `initialize`, twice, after `deinitialize`, ...)."""


class AmpUsageError(RuntimeError):
    """An amp API received an object it cannot work with (wrong type, unknown optimizer, ...)."""


class NonFiniteLossError(AmpStateError):
    """The loss itself was inf/NaN for too many consecutive iterations: scaling cannot help."""
