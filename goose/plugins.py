"""Plugin loading: built-ins and third-party distributions come in the same way, via entry points.

``registry()`` scans the ``goose`` entry-point group once and asks every plugin module to register
its sources and topologies; ``register()`` adds one at run time and ``unregister()`` takes it out
again. Calling the registered plugins while decoding, with their faults contained, is
:mod:`goose.contract.boundary`'s job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from goose import hookspecs
from goose.config import GooseConfig

logger = logging.getLogger("goose.plugins")

ENTRY_POINT_GROUP = "goose"
BUILTIN_ORIGIN = "built-in"
OWN_DISTRIBUTION = "goose-decoding"
DEFAULT_INITIAL_ACCEPTANCE = 0.3


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded or registered."""


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # "source" or "topology"
    factory: Callable[[GooseConfig], Any]
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""
    initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE  # sources: the estimate before any verification


@dataclass
class Registry:
    """Every registered source and topology, by name."""

    sources: dict[str, Registration] = field(default_factory=dict)
    topologies: dict[str, Registration] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)

    def add_plugin(self, plugin: object, origin: str) -> list[Registration]:
        """Ask one registration plugin (module or object) to register what it provides; returns what it added."""
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        manager.register(plugin)
        added: list[Registration] = []
        manager.hook.goose_register_sources(register=self._registrar("source", self.sources, origin, added))
        manager.hook.goose_register_topologies(register=self._registrar("topology", self.topologies, origin, added))
        return added

    def remove(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            table = self.sources if registration.kind == "source" else self.topologies
            if table.get(registration.name) is registration:
                del table[registration.name]

    def _registrar(self, kind: str, table: dict[str, Registration], origin: str,
                   added: list[Registration]) -> Callable[..., None]:
        def register(name: str, factory: Callable[[GooseConfig], Any], description: str = "",
                     initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE) -> None:
            if name in table and table[name].factory is not factory:
                raise PluginError(f"{kind} {name!r} is registered twice ({table[name].origin} and {origin})")
            if not 0.0 <= float(initial_acceptance) <= 1.0:
                raise PluginError(f"{kind} {name!r}: initial_acceptance must lie in [0, 1], got {initial_acceptance}")
            table[name] = Registration(name, kind, factory, origin, description, float(initial_acceptance))
            added.append(table[name])

        return register

    def source(self, name: str) -> Registration:
        return self._lookup(name, self.sources, "source")

    def topology(self, name: str) -> Registration:
        return self._lookup(name, self.topologies, "topology")

    def _lookup(self, name: str, table: dict[str, Registration], kind: str) -> Registration:
        if name not in table:
            known = ", ".join(sorted(table)) or "none (is goose installed? run `pip install -e .`)"
            raise PluginError(f"unknown {kind} {name!r}; registered {kind}s: {known}")
        return table[name]


_REGISTRY: Registry | None = None


def registry(refresh: bool = False) -> Registry:
    """The process-wide registry, loaded from the ``goose`` entry-point group on first use."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = _load_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
    return _REGISTRY


def _load_entry_points(entry_points: Iterable[metadata.EntryPoint]) -> Registry:
    found = Registry()
    seen: set[tuple[str, str]] = set()
    for entry_point in sorted(entry_points, key=lambda ep: ep.name):
        distribution = entry_point.dist.name if entry_point.dist is not None else "unknown"
        if (distribution, entry_point.value) in seen:  # an editable install can list a path twice
            continue
        seen.add((distribution, entry_point.value))
        origin = BUILTIN_ORIGIN if distribution == OWN_DISTRIBUTION else distribution
        try:
            found.add_plugin(entry_point.load(), origin)
        except PluginError:
            raise
        except Exception as error:  # a broken third-party plugin must not break goose itself
            message = f"plugin {entry_point.name!r} from {distribution} failed to load: {error}"
            logger.warning(message)
            found.load_errors.append(message)
    return found


def register(plugin: object, origin: str = "runtime") -> list[Registration]:
    """Register a plugin module or object in this process without packaging it (notebooks, tests).

    Returns the registrations it made; ``unregister`` takes them out again.
    """
    return registry().add_plugin(plugin, origin)


class SourcePlugin:
    """A registration plugin for one source class: ``register(SourcePlugin("name", Class))`` in a script or notebook."""

    def __init__(self, name: str, factory: Callable[[GooseConfig], Any], description: str = "",
                 initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE) -> None:
        self.name, self.factory, self.description = name, factory, description
        self.initial_acceptance = initial_acceptance

    @hookspecs.hookimpl
    def goose_register_sources(self, register: hookspecs.Register) -> None:
        register(self.name, self.factory, description=self.description, initial_acceptance=self.initial_acceptance)


def unregister(registrations: list[Registration]) -> None:
    """Remove registrations made by :func:`register` (a test cleaning up after itself)."""
    registry().remove(registrations)
