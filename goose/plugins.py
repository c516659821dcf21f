"""Plugin loading: built-ins and third-party distributions come in the same way, through the ``goose`` entry points.

``registry()`` asks every registration plugin once for its sources, topologies and commands (built-ins first, so
a third-party plugin never displaces one); ``register()`` adds one at run time. :func:`manager` checks a plugin's
shape through pluggy; calling it while decoding is :mod:`goose.boundary`'s job.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from goose import hookspecs

logger = logging.getLogger("goose.plugins")

ENTRY_POINT_GROUP = "goose"
BUILTIN_ORIGIN = "built-in"
OWN_DISTRIBUTION = "goose-decoding"
HOOKS = {  # the hooks each kind of plugin object may implement, in the specs' order
    "registration": ("goose_register_sources", "goose_register_topologies", "goose_register_commands"),
    "source": ("goose_reset", "goose_prefill", "goose_propose", "goose_successors", "goose_auxiliary_rows",
               "goose_observe"),
    "topology": ("goose_plan_tree", "goose_spine_lengths"),
}
TABLES = {"source": "sources", "topology": "topologies", "command": "commands"}  # a kind -> its Registry table


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded, registered or made."""


class _OneKind(pluggy.PluginManager):
    """pluggy's manager, refusing a ``goose_*`` method that is no marked hook of the plugin's kind."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.kind, self.name, self.parsing = kind, name, ""

    def parse_hookimpl_opts(self, plugin: object, attribute: str) -> Any:
        options = super().parse_hookimpl_opts(plugin, attribute)
        if options is None and not (attribute.startswith("goose_") and callable(getattr(plugin, attribute, None))):
            return None
        self.parsing, allowed = (options or {}).get("specname") or attribute, HOOKS[self.kind]
        where = f"{self.kind} {self.name!r}: {attribute}"
        if self.parsing not in allowed:
            other = next((kind for kind, hooks in HOOKS.items() if self.parsing in hooks), None)
            near = difflib.get_close_matches(self.parsing, allowed, n=1)
            raise PluginError(f"{where} is a {other} hook; a {self.kind} implements only {', '.join(allowed)}"
                              if other else f"{where} is not a Goose hook (" +
                              (f"did you mean {near[0]}?)" if near else f"{self.kind} hooks are {', '.join(allowed)})"))
        if options is None:
            raise PluginError(f"{where} is not marked @goose.hookimpl, so Goose would never call it")
        return options


def manager(plugin: object, kind: str, name: str) -> pluggy.PluginManager:
    """A pluggy manager holding one plugin (class, instance or module), its shape checked (PluginError): its hooks
    are called through ``manager.hook``; an argument its spec does not pass is refused by pluggy's own check."""
    plugins = _OneKind(kind, name)
    try:
        plugins.register(plugin, name=name)
    except pluggy.PluginValidationError as error:
        passed = ", ".join(getattr(plugins.hook, plugins.parsing).spec.argnames)
        raise PluginError(f"{kind} {name!r}: {error}; {plugins.parsing} passes {passed}") from None
    return plugins


def implemented(plugins: pluggy.PluginManager, kind: str) -> dict[str, tuple[str, ...]]:
    """The hooks of :func:`manager`'s plugin -> the arguments each asks for (pluggy's: those without defaults)."""
    return {hook: impls[0].argnames for hook in HOOKS[kind] if (impls := getattr(plugins.hook, hook).get_hookimpls())}


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # "source", "topology" or "command"
    factory: Callable[..., Any]  # sources and topologies: factory(config); commands: add_arguments(parser)
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""
    initial_acceptance: float = 0.3  # sources: the estimate before any verification
    shareable: bool = False  # sources: one instance may serve every slot of a decoder


@dataclass
class Registry:
    """Every registered source, topology and command, by name."""

    sources: dict[str, Registration] = field(default_factory=dict)
    topologies: dict[str, Registration] = field(default_factory=dict)
    commands: dict[str, Registration] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)

    def add_plugin(self, plugin: object, origin: str, strict: bool = True) -> list[Registration]:
        """What one registration plugin registers. A registration that breaks the contract raises PluginError when
        ``strict`` (an explicit call); otherwise it is skipped, logged and kept in ``load_errors``."""
        hooks = manager(plugin, "registration", getattr(plugin, "__name__", type(plugin).__name__)).hook
        added: list[Registration] = []
        for kind, table in TABLES.items():
            getattr(hooks, f"goose_register_{table}")(register=self._registrar(kind, origin, added, strict))
        return added

    def remove(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            table = getattr(self, TABLES[registration.kind])
            if table.get(registration.name) is registration:
                del table[registration.name]

    def _registrar(self, kind: str, origin: str, added: list[Registration], strict: bool) -> Callable[..., None]:
        table = getattr(self, TABLES[kind])

        def register(name: str, factory: Callable[..., Any], description: str = "", initial_acceptance: float = 0.3,
                     shareable: bool = False) -> None:
            try:
                if name in table and table[name].factory is not factory:
                    raise PluginError(f"{kind} {name!r} from {origin} is not registered: the name is taken by "
                                      f"{table[name].origin}'s; register it under another name")
                if not 0.0 <= float(initial_acceptance) <= 1.0:
                    raise PluginError(f"{kind} {name!r}: initial_acceptance must lie in [0, 1], got "
                                      f"{initial_acceptance}")
                if not isinstance(shareable, bool):
                    raise PluginError(f"{kind} {name!r}: shareable must be True or False, got {shareable!r}")
                if inspect.isclass(factory) and kind != "command":  # a factory function: its product, when made
                    manager(factory, kind, name)
            except PluginError as error:
                if strict:
                    raise
                self.load_errors.append(f"{error} (from {origin}: not registered)")
                logger.error("%s", self.load_errors[-1])
                return
            table[name] = Registration(name, kind, factory, origin, description, float(initial_acceptance), shareable)
            added.append(table[name])

        return register

    def signatures(self, registration: Registration) -> dict[str, tuple[str, ...]]:
        """The hooks a registration's class implements -> the arguments each asks for; {} for a factory function."""
        if not inspect.isclass(registration.factory):
            return {}
        return implemented(manager(registration.factory, registration.kind, registration.name), registration.kind)

    def source(self, name: str) -> Registration:
        return self._lookup("source", name)

    def topology(self, name: str) -> Registration:
        return self._lookup("topology", name)

    def _lookup(self, kind: str, name: str) -> Registration:
        table = getattr(self, TABLES[kind])
        if name not in table:
            known = ", ".join(sorted(table)) or "none (is goose installed? run `pip install -e .`)"
            raise PluginError(f"unknown {kind} {name!r}; registered {TABLES[kind]}: {known}")
        return table[name]

    def check_options(self, kind: str, options: dict[str, Any]) -> None:
        """PluginError for options naming no registered plugin of ``kind`` (they would be ignored without a word)."""
        table = getattr(self, TABLES[kind])
        if unknown := sorted(set(options) - set(table)):
            raise PluginError(f"{kind}_options names {', '.join(map(repr, unknown))}, not a registered {kind}; "
                              f"registered {TABLES[kind]}: {', '.join(sorted(table))}")


_REGISTRY: Registry | None = None


def registry(refresh: bool = False) -> Registry:
    """The process-wide registry, loaded from the ``goose`` entry-point group on first use."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = _load_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
    return _REGISTRY


def _load_entry_points(entry_points: Iterable[metadata.EntryPoint]) -> Registry:
    """Every entry point's registrations, built-ins first. A built-in that breaks the contract is goose's own bug
    and raises; a third-party plugin that breaks it or fails to import is kept in ``load_errors``."""
    found, seen = Registry(), set()

    def distribution(entry_point: metadata.EntryPoint) -> str:
        return entry_point.dist.name if entry_point.dist is not None else "unknown"

    for entry_point in sorted(entry_points, key=lambda ep: (distribution(ep) != OWN_DISTRIBUTION, ep.name)):
        origin = distribution(entry_point)
        if (origin, entry_point.value) in seen:  # an editable install can list a path twice
            continue
        seen.add((origin, entry_point.value))
        builtin = origin == OWN_DISTRIBUTION
        try:
            found.add_plugin(entry_point.load(), BUILTIN_ORIGIN if builtin else origin, strict=builtin)
        except Exception as error:  # a plugin that cannot even be imported must not break goose itself
            if builtin:
                raise
            found.load_errors.append(f"plugin {entry_point.name!r} from {origin} " + (
                f"is not registered: {error}" if isinstance(error, PluginError) else f"failed to load: {error}"))
            logger.warning(found.load_errors[-1])
    return found


def register(plugin: object, origin: str = "runtime") -> list[Registration]:
    """Register a plugin module or object in this process (notebooks, tests); PluginError when it breaks the
    contract. Returns its registrations, for :func:`unregister`."""
    return registry().add_plugin(plugin, origin)


def unregister(registrations: list[Registration]) -> None:
    """Take out what :func:`register` added."""
    registry().remove(registrations)


class SourcePlugin:
    """A registration plugin for one source: ``register(SourcePlugin("name", Class, initial_acceptance=0.5))``."""

    def __init__(self, name: str, factory: Callable[..., Any], **options: Any) -> None:
        self.arguments, self.options = (name, factory), options

    @hookspecs.hookimpl
    def goose_register_sources(self, register: hookspecs.Register) -> None:
        register(*self.arguments, **self.options)
