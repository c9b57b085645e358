"""The exceptions weft raises: one class per kind of failure, each carrying weft's message.

Every class derives from :class:`Error`, and also from the built-in exception a Python program
would expect for that kind (``InvalidArgument`` is a ``ValueError``, ``Timeout`` a
``TimeoutError``, ``Unavailable`` a ``ConnectionError``, ``NotFound`` a ``LookupError``).
"""

from __future__ import annotations

from . import _weft


class Error(Exception):
    """A weft call failed; ``str(error)`` is weft's message, ``error.code`` its kind."""

    code = "error"


class InvalidArgument(Error, ValueError):
    """The input is malformed or out of range (a bad store URI, tensor, prompt, setting)."""

    code = "invalid argument"


class NotFound(Error, LookupError):
    """The named thing does not exist (a run, a version, a cluster)."""

    code = "not found"


class Conflict(Error):
    """Another writer won, or the state does not allow it (a run that exists, a refused version,
    a delta made for another base)."""

    code = "conflict"


class Unavailable(Error, ConnectionError):
    """A peer or resource is down; retrying later may succeed."""

    code = "unavailable"


class Timeout(Error, TimeoutError):
    """A deadline passed."""

    code = "timeout"


class DataLoss(Error):
    """Stored or transmitted data is corrupted or truncated (a digest or hash that does not
    match)."""

    code = "data loss"


class Internal(Error):
    """An invariant did not hold: a bug in weft."""

    code = "internal"


_weft._set_error_classes(
    {cls.code: cls for cls in (InvalidArgument, NotFound, Conflict, Unavailable, Timeout, DataLoss,
                               Internal)})
