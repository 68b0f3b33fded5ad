"""From what a caller asked for to a layout object, and why: the one conversion.

``raytf.fit``, ``raytf.plan``, the CLI, experiment files and sweep trials all describe a
layout the same way, as a :class:`LayoutRequest` ("auto", a registered name with options
such as ``workers=4``, or a layout object; plus replicas, use_gpu and the auto rule's hints),
and all turn it into a layout here. Pure: no Ray, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raytf._internal.checks import positive_int
from raytf._internal.cluster import ClusterInfo
from raytf._internal.selection import choose_layout, default_replicas, resolve_use_gpu
from raytf.errors import ConfigError
from raytf.layouts import Layout, layout_option_names, resolve

HINTS = ("stragglers", "preemptible")


@dataclass(frozen=True)
class LayoutRequest:
    layout: str | Layout = "auto"
    #: Options that shape a named layout (its dataclass fields: workers, devices, ps, ...).
    options: Mapping[str, Any] = field(default_factory=dict)
    replicas: int | None = None
    use_gpu: bool | None = None
    stragglers: bool = False
    preemptible: bool = False

    def __post_init__(self) -> None:
        for name in HINTS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{name} must be True or False, received {getattr(self, name)!r}."
                )
        if not isinstance(self.layout, (str, Layout)):
            raise ConfigError(
                f"layout must be 'auto', a layout name or a layout object, received "
                f"{type(self.layout).__name__}."
            )
        positive_int("replicas", self.replicas, "It counts devices.", allow_none=True)
        if isinstance(self.layout, str) and self.layout != "auto":
            cls, _ = resolve(self.layout)  # a typo fails here, before Ray starts
            accepted = {f.name for f in dataclasses.fields(cls)}
            wrong = sorted(set(self.options) - accepted)
            if wrong:
                raise ConfigError(
                    f"Layout {self.layout!r} does not take {wrong}; it takes "
                    f"{sorted(accepted & layout_option_names())}."
                )
        elif self.options:
            what = "the layout object" if isinstance(self.layout, Layout) else "layout='auto'"
            raise ConfigError(
                f"{sorted(self.options)} shape a named layout, not {what}; name one "
                "(--layout all-reduce, in-graph, parameter-server), set them on the object, "
                "or leave them out and let raytf choose."
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LayoutRequest:
        """From a flat config (YAML, CLI flags, a sweep trial): ``layout``, its options, and
        ``replicas`` / ``use_gpu`` / hints; other keys are ignored."""
        names = layout_option_names()
        layout = config.get("layout") or "auto"
        given = isinstance(layout, Layout)  # an object (a sweep's space) fixes its own size
        return cls(
            layout=layout,
            options={k: config[k] for k in names if config.get(k) is not None},
            replicas=None if given else config.get("replicas"),
            use_gpu=None if given else config.get("use_gpu"),
            **{k: bool(config[k]) for k in HINTS if config.get(k) is not None},
        )

    def resolve(self, cluster: ClusterInfo) -> tuple[Layout, str]:
        """The layout for ``cluster``, and the explanation printed to the user."""
        layout = self.layout
        if isinstance(layout, Layout):
            return self._given(layout)
        if layout == "auto":
            choice = choose_layout(
                cluster,
                replicas=self.replicas,
                use_gpu=self.use_gpu,
                stragglers=self.stragglers,
                preemptible=self.preemptible,
            )
            cls, _ = resolve(choice.layout)
            return cls(**choice.options), choice.explanation
        cls, defaults = resolve(layout)
        use_gpu = resolve_use_gpu(cluster, self.use_gpu)
        options = {**defaults, **self.options}
        shaped = bool({"workers", "devices"} & set(self.options))
        if self.options and (shaped or self.replicas is None):  # the options set the shape
            chosen = cls(**options, use_gpu=use_gpu)
            if self.replicas is not None and self.replicas != chosen.num_replicas:
                raise ConfigError(
                    f"replicas={self.replicas} disagrees with {sorted(self.options.items())}, "
                    f"which make {chosen.num_replicas} replica(s); give one or the other."
                )
            return chosen, f"{chosen.name}: chosen by the caller as {chosen!r}."
        replicas, why = self.replicas, "set by the caller"
        if replicas is None:
            replicas, why = default_replicas(cluster, use_gpu)
        chosen = cls.for_replicas(replicas, use_gpu, **options)
        return chosen, f"{layout}: named by the caller; {replicas} replica(s) ({why})."

    def _given(self, layout: Layout) -> tuple[Layout, str]:
        gpu = getattr(layout, "use_gpu", None)
        if self.use_gpu is not None and gpu is not None and self.use_gpu != gpu:
            raise ConfigError(
                f"use_gpu={self.use_gpu} disagrees with the layout object ({layout!r}); set "
                f"use_gpu on the layout, e.g. {type(layout).__name__}(..., use_gpu={self.use_gpu})."
            )
        if self.replicas is not None and self.replicas != layout.num_replicas:
            raise ConfigError(
                f"replicas={self.replicas} disagrees with the layout object, which runs "
                f"{layout.num_replicas} replica(s) ({layout.describe()}); drop replicas=."
            )
        return layout, f"{layout.name}: chosen by the caller as {layout!r}."
