"""Plugin loading: built-ins and third-party distributions come in the same way, via entry points.

``registry()`` scans the ``goose`` entry-point group once and asks every plugin module to register
its sources and topologies; ``register()`` adds one at run time and ``unregister()`` takes it out
again. Calling the registered plugins while decoding, with their faults contained, is
:mod:`goose.boundary`'s job.

A plugin's *shape* is checked here, when it registers and again when the decoder makes its
instances (:func:`check_hooks`): a misspelled hook, a hook method without ``@goose.hookimpl``, a
hook of the wrong kind or a pluggy option the boundary would ignore raises :class:`PluginError`
naming it, instead of costing a source's drafts without a word. Built-ins load first, so a
third-party plugin can never displace one; what a third-party plugin gets wrong is logged and
recorded in ``Registry.load_errors``, and the rest of the registry stays usable.
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
from goose.config import GooseConfig

logger = logging.getLogger("goose.plugins")

ENTRY_POINT_GROUP = "goose"
BUILTIN_ORIGIN = "built-in"
OWN_DISTRIBUTION = "goose-decoding"
DEFAULT_INITIAL_ACCEPTANCE = 0.3


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded or registered."""


# the hooks each kind of plugin object may implement (the rest of hookspecs belongs to other kinds)
REGISTRATION_HOOKS = ("goose_register_sources", "goose_register_topologies")
SOURCE_HOOKS = ("goose_reset", "goose_prefill", "goose_propose", "goose_successors", "goose_auxiliary_rows",
                "goose_observe")
TOPOLOGY_HOOKS = ("goose_plan_tree", "goose_spine_lengths")
HOOKS = {"registration": REGISTRATION_HOOKS, "source": SOURCE_HOOKS, "topology": TOPOLOGY_HOOKS}
# pluggy orders and wraps implementations of one hook; the boundary calls each source's and the
# topology's own implementation directly, so these options would be silently ignored: refused instead
IGNORED_OPTIONS = ("tryfirst", "trylast", "hookwrapper", "wrapper", "optionalhook")
_MARK = f"{hookspecs.PROJECT}_impl"  # the attribute @goose.hookimpl sets on a function


def check_hooks(plugin: object, kind: str, name: str) -> tuple[str, ...]:
    """The hooks ``plugin`` (a class, an instance or a module) implements as a ``kind`` plugin; PluginError if
    it has a ``goose_*`` attribute that is not one of them, a hook without ``@goose.hookimpl``, an argument its
    hook does not pass, or a pluggy option the boundary ignores (``tryfirst``, ``trylast``, ``hookwrapper``,
    ``wrapper``, ``optionalhook``)."""
    return tuple(hook_signatures(plugin, kind, name))


def hook_signatures(plugin: object, kind: str, name: str) -> dict[str, tuple[str, ...]]:
    """:func:`check_hooks`, with the arguments each hook implementation asks for (hooks in the spec's order)."""
    allowed = HOOKS[kind]
    found: dict[str, tuple[str, ...]] = {}
    for attribute in dir(plugin):
        value = inspect.getattr_static(plugin, attribute, None)
        function = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        if not callable(function):
            continue
        options = getattr(function, _MARK, None)
        if not attribute.startswith("goose_") and options is None:
            continue
        hook = (options or {}).get("specname") or attribute
        where = f"{kind} {name!r}: {attribute}"
        if hook not in allowed:
            others = [k for k, hooks in HOOKS.items() if hook in hooks]
            if others:
                raise PluginError(f"{where} is a {others[0]} hook; a {kind} implements only {', '.join(allowed)}")
            near = difflib.get_close_matches(hook, allowed, n=1)
            hint = f"did you mean {near[0]}?" if near else f"{kind} hooks are {', '.join(allowed)}"
            raise PluginError(f"{where} is not a Goose hook ({hint})")
        if options is None:
            raise PluginError(f"{where} is not marked @goose.hookimpl, so Goose would never call it")
        ignored = [option for option in IGNORED_OPTIONS if options.get(option)]
        if ignored:
            raise PluginError(f"{where} uses @goose.hookimpl({'=True, '.join(ignored)}=True), which Goose ignores: "
                              f"it calls every {kind}'s hook itself, in its own order; drop the option")
        # called bound: a plain method of a class or instance (not a module's function, not a staticmethod)
        bound = not inspect.ismodule(plugin) and not isinstance(value, staticmethod)
        found[hook] = _checked_arguments(function, hook, where, bound)
    return {hook: found[hook] for hook in allowed if hook in found}


def _checked_arguments(function: Callable[..., Any], hook: str, where: str, bound: bool) -> tuple[str, ...]:
    """The arguments a hook implementation asks for, as pluggy reads them (parameters without defaults, ``self``
    left out); PluginError for one its hook does not pass (a misspelling, say)."""
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    asked = tuple(p.name for p in parameters[1 if bound else 0:])
    passed = tuple(inspect.signature(getattr(hookspecs, hook)).parameters)
    unknown = [argument for argument in asked if argument not in passed]
    if unknown:
        hints = [f"{argument!r} -> {near[0]!r}" for argument in unknown
                 for near in [difflib.get_close_matches(argument, passed, n=1)] if near]
        raise PluginError(f"{where} asks for {', '.join(map(repr, unknown))}, which {hook} does not pass (it passes "
                          f"{', '.join(passed)})" + (f"; did you mean {', '.join(hints)}?" if hints else ""))
    return asked


def plugin_manager(plugins: dict[str, object], kind: str) -> pluggy.PluginManager:
    """A pluggy manager holding ``plugins`` (name -> object) after :func:`check_hooks` and pluggy's own checks
    (argument names against the hookspecs, no hook left without a spec); PluginError naming the culprit."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    for name, plugin in plugins.items():
        check_hooks(plugin, kind, name)
        try:
            manager.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as error:
            raise PluginError(f"{kind} {name!r}: {error}") from None
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as error:
        raise PluginError(str(error)) from None
    return manager


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # "source" or "topology"
    factory: Callable[[GooseConfig], Any]
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""
    initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE  # sources: the estimate before any verification
    shareable: bool = False  # sources: one instance may serve every row of a batch (knowledge of the model)


@dataclass
class Registry:
    """Every registered source and topology, by name."""

    sources: dict[str, Registration] = field(default_factory=dict)
    topologies: dict[str, Registration] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)

    def add_plugin(self, plugin: object, origin: str, strict: bool = True) -> list[Registration]:
        """Ask one registration plugin (module or object) to register what it provides; returns what it added.

        A registration that breaks the contract (a name already taken, a class whose hooks are
        misspelled or unmarked, an ``initial_acceptance`` outside [0, 1]) raises PluginError when
        ``strict`` (an explicit call); otherwise it is skipped, logged once and recorded in
        ``load_errors``, and the plugin's other registrations stand.
        """
        label = getattr(plugin, "__name__", type(plugin).__name__)
        manager = plugin_manager({label: plugin}, "registration")
        added: list[Registration] = []
        manager.hook.goose_register_sources(register=self._registrar("source", self.sources, origin, added, strict))
        manager.hook.goose_register_topologies(
            register=self._registrar("topology", self.topologies, origin, added, strict))
        return added

    def remove(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            table = self.sources if registration.kind == "source" else self.topologies
            if table.get(registration.name) is registration:
                del table[registration.name]

    def _registrar(self, kind: str, table: dict[str, Registration], origin: str,
                   added: list[Registration], strict: bool) -> Callable[..., None]:
        def register(name: str, factory: Callable[[GooseConfig], Any], description: str = "",
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
                if inspect.isclass(factory):  # a class is checked now; a factory function's product when made
                    check_hooks(factory, kind, name)
            except PluginError as error:
                if strict:
                    raise
                message = f"{error} (from {origin}: not registered)"
                logger.error("%s", message)
                self.load_errors.append(message)
                return
            table[name] = Registration(name, kind, factory, origin, description, float(initial_acceptance),
                                       shareable)
            added.append(table[name])

        return register

    def hooks(self, registration: Registration) -> tuple[str, ...]:
        """The hooks a registration's class implements; () for a factory function (known once it has made one)."""
        if not inspect.isclass(registration.factory):
            return ()
        return check_hooks(registration.factory, registration.kind, registration.name)

    def signatures(self, registration: Registration) -> dict[str, tuple[str, ...]]:
        """Each hook a registration's class implements -> the arguments it asks for; {} for a factory function."""
        if not inspect.isclass(registration.factory):
            return {}
        return hook_signatures(registration.factory, registration.kind, registration.name)

    def source(self, name: str) -> Registration:
        return self._lookup(name, self.sources, "source")

    def topology(self, name: str) -> Registration:
        return self._lookup(name, self.topologies, "topology")

    def _lookup(self, name: str, table: dict[str, Registration], kind: str) -> Registration:
        if name not in table:
            known = ", ".join(sorted(table)) or "none (is goose installed? run `pip install -e .`)"
            plural = "topologies" if kind == "topology" else f"{kind}s"
            raise PluginError(f"unknown {kind} {name!r}; registered {plural}: {known}")
        return table[name]


_REGISTRY: Registry | None = None


def registry(refresh: bool = False) -> Registry:
    """The process-wide registry, loaded from the ``goose`` entry-point group on first use."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = _load_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
    return _REGISTRY


def _distribution(entry_point: metadata.EntryPoint) -> str:
    return entry_point.dist.name if entry_point.dist is not None else "unknown"


def _load_entry_points(entry_points: Iterable[metadata.EntryPoint]) -> Registry:
    """Every entry point's registrations: built-ins first, so that a name clash always skips the newcomer.

    A built-in that breaks the contract is goose's own bug and raises; a third-party plugin that
    breaks it, or any plugin that fails to import, is logged and recorded in ``load_errors``, and
    goose works on.
    """
    found = Registry()
    seen: set[tuple[str, str]] = set()
    for entry_point in sorted(entry_points, key=lambda ep: (_distribution(ep) != OWN_DISTRIBUTION, ep.name)):
        distribution = _distribution(entry_point)
        if (distribution, entry_point.value) in seen:  # an editable install can list a path twice
            continue
        seen.add((distribution, entry_point.value))
        builtin = distribution == OWN_DISTRIBUTION
        origin = BUILTIN_ORIGIN if builtin else distribution
        try:
            found.add_plugin(entry_point.load(), origin, strict=builtin)
        except PluginError as error:
            if builtin:
                raise
            message = f"plugin {entry_point.name!r} from {distribution} is not registered: {error}"
            logger.error(message)
            found.load_errors.append(message)
        except Exception as error:  # a plugin that cannot even be imported must not break goose itself
            message = f"plugin {entry_point.name!r} from {distribution} failed to load: {error}"
            logger.warning(message)
            found.load_errors.append(message)
    return found


def register(plugin: object, origin: str = "runtime") -> list[Registration]:
    """Register a plugin module or object in this process without packaging it (notebooks, tests).

    Returns the registrations it made; ``unregister`` takes them out again. An explicit call, so a
    name already registered (or any other broken contract) raises PluginError and adds nothing more.
    """
    return registry().add_plugin(plugin, origin)


class SourcePlugin:
    """A registration plugin for one source class: ``register(SourcePlugin("name", Class))`` in a script or notebook."""

    def __init__(self, name: str, factory: Callable[[GooseConfig], Any], description: str = "",
                 initial_acceptance: float = DEFAULT_INITIAL_ACCEPTANCE, shareable: bool = False) -> None:
        self.name, self.factory, self.description = name, factory, description
        self.initial_acceptance, self.shareable = initial_acceptance, shareable

    @hookspecs.hookimpl
    def goose_register_sources(self, register: hookspecs.Register) -> None:
        register(self.name, self.factory, description=self.description, initial_acceptance=self.initial_acceptance,
                 shareable=self.shareable)


def unregister(registrations: list[Registration]) -> None:
    """Remove registrations made by :func:`register` (a test cleaning up after itself)."""
    registry().remove(registrations)
