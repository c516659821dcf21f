"""Plugin loading: built-ins and third-party distributions come in the same way, via entry points.

``registry()`` scans the ``goose`` entry-point group once and asks every plugin module to
register its sources and topologies. ``SourceSet`` is one decoder's set of live source instances
in a private PluginManager; it calls their hooks one implementation at a time so that a faulty
plugin is skipped (with one warning) instead of taking decoding down.
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


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded or registered."""


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # "source" or "topology"
    factory: Callable[[GooseConfig], Any]
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""


@dataclass
class Registry:
    """Every registered source and topology, by name."""

    sources: dict[str, Registration] = field(default_factory=dict)
    topologies: dict[str, Registration] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)

    def add_plugin(self, plugin: object, origin: str) -> None:
        """Ask one registration plugin (module or object) to register what it provides."""
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        manager.register(plugin)
        manager.hook.goose_register_sources(register=self._registrar("source", self.sources, origin))
        manager.hook.goose_register_topologies(register=self._registrar("topology", self.topologies, origin))

    def _registrar(self, kind: str, table: dict[str, Registration], origin: str) -> Callable[..., None]:
        def register(name: str, factory: Callable[[GooseConfig], Any], description: str = "") -> None:
            if name in table and table[name].factory is not factory:
                raise PluginError(f"{kind} {name!r} is registered twice ({table[name].origin} and {origin})")
            table[name] = Registration(name, kind, factory, origin, description)

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


def register(plugin: object, origin: str = "runtime") -> None:
    """Register a plugin module or object in this process without packaging it (notebooks, tests)."""
    registry().add_plugin(plugin, origin)


class SourceSet:
    """One decoder's live sources in a private PluginManager, called with fault isolation."""

    def __init__(self, names: list[str], config: GooseConfig, known: Registry | None = None) -> None:
        known = known or registry()
        self.names: tuple[str, ...] = tuple(names)
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.instances: dict[str, Any] = {}
        for name in names:
            instance = known.source(name).factory(config)
            self.manager.register(instance, name=name)
            self.instances[name] = instance
        self._warned: set[tuple[str, str]] = set()

    def call(self, hook: str, **kwargs: Any) -> dict[str, Any]:
        """Call ``hook`` on every source that implements it; {source name: result}. Faults are skipped."""
        results: dict[str, Any] = {}
        for implementation in getattr(self.manager.hook, hook).get_hookimpls():
            name = implementation.plugin_name
            try:
                results[name] = implementation.function(**{a: kwargs[a] for a in implementation.argnames})
            except Exception as error:
                self.warn_once(name, hook, f"raised {type(error).__name__}: {error}")
        return results

    def implements(self, name: str, hook: str) -> bool:
        return any(i.plugin_name == name for i in getattr(self.manager.hook, hook).get_hookimpls())

    def call_one(self, name: str, hook: str, **kwargs: Any) -> Any:
        """Call one source's implementation of ``hook``; None if it has none or it raised (logged once)."""
        for implementation in getattr(self.manager.hook, hook).get_hookimpls():
            if implementation.plugin_name == name:
                try:
                    return implementation.function(**{a: kwargs[a] for a in implementation.argnames})
                except Exception as error:
                    self.warn_once(name, hook, f"raised {type(error).__name__}: {error}")
        return None

    def warn_once(self, name: str, hook: str, problem: str) -> None:
        """Log a plugin fault once per (source, hook); the cycle goes on without that source."""
        if (name, hook) not in self._warned:
            self._warned.add((name, hook))
            logger.warning("source %r skipped in %s: %s (further faults of this kind are not logged)",
                           name, hook, problem)


def make_topology(name: str, config: GooseConfig, known: Registry | None = None) -> pluggy.HookCaller:
    """A planner instance for ``name``, wrapped in its own PluginManager; call ``.goose_plan_tree``."""
    known = known or registry()
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.register(known.topology(name).factory(config), name=name)
    return manager.hook
