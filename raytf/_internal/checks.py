"""The argument checks every config object shares: written once, worded the same."""

from __future__ import annotations

from typing import Any

from raytf.errors import ConfigError


def _where(owner: str, name: str) -> str:
    return f"{owner}: {name}" if owner else name


def positive_int(
    name: str, value: Any, fix: str = "", *, owner: str = "", allow_none: bool = False
) -> None:
    """``value`` must be an int >= 1 (a bool is refused); ``fix`` ends the message."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        tail = " or None" if allow_none else ""
        raise ConfigError(
            f"{_where(owner, name)} must be a positive integer{tail}, received {value!r}. "
            + (fix or f"Pass for example {name}=2.")
        )


def non_negative_int(name: str, value: Any, fix: str = "", *, owner: str = "") -> None:
    """``value`` must be an int >= 0 (a count that may be zero)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{_where(owner, name)} must be an integer >= 0, received {value!r}. "
            + (fix or f"Pass for example {name}=1.")
        )


def positive_number(
    name: str, value: Any, fix: str = "", *, owner: str = "", allow_none: bool = False
) -> None:
    """``value`` must be a number > 0 (seconds, CPUs)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        tail = " or None" if allow_none else ""
        raise ConfigError(
            f"{_where(owner, name)} must be a positive number{tail}, received {value!r}. "
            + (fix or f"Pass for example {name}=1.")
        )
