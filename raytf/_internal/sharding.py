"""Which parameter server owns which variable: a pure function, tested without Ray or TF."""

from __future__ import annotations

from collections.abc import Sequence

from raytf.errors import ConfigError


def shard_by_size(sizes: Sequence[int], servers: int) -> list[int]:
    """The server of each variable, balancing bytes: largest first onto the least-loaded one.

    Whole variables only (a server applies the optimizer to what it owns, so a variable must
    not be split); ties go to the lower server index, so the result is deterministic.
    """
    if servers < 1:
        raise ConfigError(f"Sharding needs at least one server, received {servers!r}.")
    if servers > len(sizes):
        raise ConfigError(
            f"ps={servers} server(s) but the model has {len(sizes)} variable(s) to place: "
            f"at least one server would hold nothing. Use ps={max(1, len(sizes))} or fewer."
        )
    load = [0] * servers
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(servers), key=lambda s: (load[s], s))
        owner[i] = target
        load[target] += sizes[i]
    return owner
