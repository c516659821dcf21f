"""Plugin loading: built-ins and third-party distributions come in the same way, through the ``goose`` entry points.

``registry()`` scans the entry-point group once and asks every registration plugin for its sources,
topologies and commands; ``register()`` adds one at run time, ``unregister()`` takes it out. A
plugin's shape is checked when it registers (:func:`hook_signatures`); calling plugins while
decoding, faults contained, is :mod:`goose.boundary`'s job. Built-ins load first, so a third-party
plugin never displaces one; what a third-party plugin gets wrong lands in ``load_errors``.
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
DEFAULT_INITIAL_ACCEPTANCE = 0.3
HOOKS = {  # the hooks each kind of plugin object may implement
    "registration": ("goose_register_sources", "goose_register_topologies", "goose_register_commands"),
    "source": ("goose_reset", "goose_prefill", "goose_propose", "goose_successors", "goose_auxiliary_rows",
               "goose_observe"),
    "topology": ("goose_plan_tree", "goose_spine_lengths"),
}
_MARK = f"{hookspecs.PROJECT}_impl"  # the attribute @goose.hookimpl sets


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded, registered or made."""


def hook_signatures(plugin: object, kind: str, name: str) -> dict[str, tuple[str, ...]]:
    """The hooks ``plugin`` (class, instance or module) implements as a ``kind`` plugin -> the arguments each asks
    for; PluginError for a ``goose_*`` attribute that is no hook of its kind, a hook without ``@goose.hookimpl``,
    or an argument its spec does not pass (pluggy's rule: parameters without defaults, ``self`` left out)."""
    allowed, found = HOOKS[kind], {}
    for attribute in dir(plugin):
        value = inspect.getattr_static(plugin, attribute, None)
        function = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        options = getattr(function, _MARK, None)
        if not callable(function) or (options is None and not attribute.startswith("goose_")):
            continue
        hook, where = (options or {}).get("specname") or attribute, f"{kind} {name!r}: {attribute}"
        if hook not in allowed:
            other = next((k for k, hooks in HOOKS.items() if hook in hooks), None)
            if other:
                raise PluginError(f"{where} is a {other} hook; a {kind} implements only {', '.join(allowed)}")
            near = difflib.get_close_matches(hook, allowed, n=1)
            hint = f"did you mean {near[0]}?" if near else f"{kind} hooks are {', '.join(allowed)}"
            raise PluginError(f"{where} is not a Goose hook ({hint})")
        if options is None:
            raise PluginError(f"{where} is not marked @goose.hookimpl, so Goose would never call it")
        parameters = [p for p in inspect.signature(function).parameters.values()
                      if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        bound = not inspect.ismodule(plugin) and not isinstance(value, staticmethod)
        asked = tuple(p.name for p in parameters[1 if bound else 0:])
        passed = tuple(inspect.signature(getattr(hookspecs, hook)).parameters)
        unknown = [argument for argument in asked if argument not in passed]
        if unknown:
            hints = [f"{a!r} -> {near[0]!r}" for a in unknown for near in [difflib.get_close_matches(a, passed, n=1)]
                     if near]
            raise PluginError(f"{where} asks for {', '.join(map(repr, unknown))}, which {hook} does not pass (it "
                              f"passes {', '.join(passed)})" + (f"; did you mean {', '.join(hints)}?" if hints else ""))
        found[hook] = asked
    return {hook: found[hook] for hook in allowed if hook in found}


def manager(plugin: object, kind: str, name: str) -> pluggy.PluginManager:
    """A pluggy manager holding one checked plugin: its hooks are called through ``manager.hook``."""
    hook_signatures(plugin, kind, name)
    plugins = pluggy.PluginManager(hookspecs.PROJECT)
    plugins.add_hookspecs(hookspecs)
    try:
        plugins.register(plugin, name=name)
        plugins.check_pending()
    except (pluggy.PluginValidationError, ValueError) as error:
        raise PluginError(f"{kind} {name!r}: {error}") from None
    return plugins


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # "source", "topology" or "command"
    factory: Callable[..., Any]  # sources and topologies: factory(config); commands: add_arguments(parser)
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""
    initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE  # sources: the estimate before any verification
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
        for kind, table, call in (("source", self.sources, hooks.goose_register_sources),
                                  ("topology", self.topologies, hooks.goose_register_topologies),
                                  ("command", self.commands, hooks.goose_register_commands)):
            call(register=self._registrar(kind, table, origin, added, strict))
        return added

    def remove(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            table = {"source": self.sources, "topology": self.topologies, "command": self.commands}[registration.kind]
            if table.get(registration.name) is registration:
                del table[registration.name]

    def _registrar(self, kind: str, table: dict[str, Registration], origin: str, added: list[Registration],
                   strict: bool) -> Callable[..., None]:
        def register(name: str, factory: Callable[..., Any], description: str = "",
                     initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE, shareable: bool = False) -> None:
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
                    hook_signatures(factory, kind, name)
            except PluginError as error:
                if strict:
                    raise
                message = f"{error} (from {origin}: not registered)"
                logger.error("%s", message)
                self.load_errors.append(message)
                return
            table[name] = Registration(name, kind, factory, origin, description, float(initial_acceptance), shareable)
            added.append(table[name])

        return register

    def signatures(self, registration: Registration) -> dict[str, tuple[str, ...]]:
        """The hooks a registration's class implements -> the arguments each asks for; {} for a factory function."""
        if not inspect.isclass(registration.factory):
            return {}
        return hook_signatures(registration.factory, registration.kind, registration.name)

    def source(self, name: str) -> Registration:
        return self._lookup(name, self.sources, "source", "sources")

    def topology(self, name: str) -> Registration:
        return self._lookup(name, self.topologies, "topology", "topologies")

    @staticmethod
    def _lookup(name: str, table: dict[str, Registration], kind: str, plural: str) -> Registration:
        if name not in table:
            known = ", ".join(sorted(table)) or "none (is goose installed? run `pip install -e .`)"
            raise PluginError(f"unknown {kind} {name!r}; registered {plural}: {known}")
        return table[name]


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
            message = f"plugin {entry_point.name!r} from {origin} " + (
                f"is not registered: {error}" if isinstance(error, PluginError) else f"failed to load: {error}")
            logger.warning(message)
            found.load_errors.append(message)
    return found


def register(plugin: object, origin: str = "runtime") -> list[Registration]:
    """Register a plugin module or object in this process (notebooks, tests); PluginError when it breaks the
    contract. Returns its registrations, for :func:`unregister`."""
    return registry().add_plugin(plugin, origin)


def unregister(registrations: list[Registration]) -> None:
    """Take out what :func:`register` added."""
    registry().remove(registrations)


class SourcePlugin:
    """A registration plugin for one source class: ``register(SourcePlugin("name", Class))``."""

    def __init__(self, name: str, factory: Callable[..., Any], description: str = "",
                 initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE, shareable: bool = False) -> None:
        self.name, self.factory, self.description = name, factory, description
        self.initial_acceptance, self.shareable = initial_acceptance, shareable

    @hookspecs.hookimpl
    def goose_register_sources(self, register: hookspecs.Register) -> None:
        register(self.name, self.factory, description=self.description, initial_acceptance=self.initial_acceptance,
                 shareable=self.shareable)
