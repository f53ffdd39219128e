"""Exception types shared by the manager, the scenario loader and the executors.

Bad input raises a ``ValueError`` subclass naming the value and the rule it broke; a call made in
the wrong state raises a ``RuntimeError`` subclass. A manager call that raises leaves the manager
exactly as it was before the call.
"""

from __future__ import annotations


class KvsimError(Exception):
    """Base of every error kvsim raises on purpose."""


class ConfigError(KvsimError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class InvalidArgumentError(KvsimError, ValueError):
    """An API argument breaks the call's contract (negative size, shrinking history, ...)."""


class InvalidStateError(KvsimError, RuntimeError):
    """The call is not allowed in the current state (resize on a SUSPENDED cache, ...)."""


class CachesStillOpenError(InvalidStateError):
    """A manager-wide operation that needs every cache closed (or suspended) found open ones."""


class OutOfPagesError(KvsimError, RuntimeError):
    """Not enough slots could be found, even after evicting everything evictable."""


class InvariantViolation(KvsimError, RuntimeError):
    """The manager's internal state broke one of its invariants: a bug, never bad input."""
