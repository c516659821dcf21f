"""Plugin loading: built-ins and third-party distributions come in the same way, through the ``goose`` entry points.

``registry()`` asks every registration plugin once for its sources, topologies and commands (built-ins first);
``register()`` adds one at run time. :class:`Manager` checks a plugin's shape; :mod:`goose.boundary` calls it.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial, partialmethod
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy
from pydantic import BaseModel, ValidationError

from goose import hookspecs
from goose.config import did_you_mean

if TYPE_CHECKING:
    from goose.config import GooseConfig

logger = logging.getLogger("goose.plugins")

ENTRY_POINT_GROUP, BUILTIN_ORIGIN, OWN_DISTRIBUTION = "goose", "built-in", "goose-decoding"
HOOKS = {"registration": ("goose_register_sources", "goose_register_topologies", "goose_register_commands"),
         "source": ("goose_reset", "goose_prefill", "goose_propose", "goose_successors", "goose_auxiliary_rows",
                    "goose_observe"), "topology": ("goose_plan_tree", "goose_spine_lengths")}  # in the specs' order
TABLES = {"source": "sources", "topology": "topologies", "command": "commands"}  # a kind -> its Registry table
REQUEST_INPUTS = ("prediction",)  # what a request may bring for its sources (DecodeContext.prediction)
_REGISTRY: Registry | None = None  # registry()'s, loaded on first use


class PluginError(ValueError):
    """An unknown plugin name, or a plugin that cannot be loaded, registered or made."""


class Manager(pluggy.PluginManager):
    """A pluggy manager holding one plugin (class, instance or module) of one kind, its shape checked (PluginError):
    a ``goose_*`` method that is no marked hook of its kind here, an argument its spec does not pass by pluggy."""

    def __init__(self, plugin: object, kind: str, name: str) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.kind, self.name, self.parsing = kind, name, ""
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as error:
            passed = ", ".join(getattr(self.hook, self.parsing).spec.argnames)
            raise PluginError(f"{kind} {name!r}: {error}; {self.parsing} passes {passed}".replace("\n", "; ")) from None

    def parse_hookimpl_opts(self, plugin: object, attribute: str) -> Any:
        options = super().parse_hookimpl_opts(plugin, attribute)
        if options is None and not (attribute.startswith("goose_") and callable(getattr(plugin, attribute, None))):
            return None
        self.parsing, allowed = (options or {}).get("specname") or attribute, HOOKS[self.kind]
        where = f"{self.kind} {self.name!r}: {attribute}"
        if self.parsing not in allowed:
            other = next((kind for kind, hooks in HOOKS.items() if self.parsing in hooks), None)
            near = difflib.get_close_matches(self.parsing, allowed, n=1) or [f"one of {', '.join(allowed)}"]
            raise PluginError(f"{where} is a {other} hook; a {self.kind} implements only {', '.join(allowed)}" if other
                              else f"{where} is not a Goose hook (did you mean {near[0]}?)")
        if options is None:
            raise PluginError(f"{where} is not marked @goose.hookimpl, so Goose would never call it")
        return options

    def implemented(self) -> dict[str, tuple[str, ...]]:
        """The plugin's hooks -> the arguments each asks for (pluggy's rule: those without defaults)."""
        hooks = {hook: getattr(self.hook, hook).get_hookimpls() for hook in HOOKS[self.kind]}
        return {hook: impls[0].argnames for hook, impls in hooks.items() if impls}


@dataclass(frozen=True)
class Registration:  # checked as it is made (PluginError): a class's shape, a source's options
    name: str
    kind: str  # "source", "topology" or "command"
    factory: Callable[..., Any]  # sources and topologies: factory(config); commands: add_arguments(parser)
    origin: str  # "built-in" or the distribution that registered it
    description: str = ""
    initial_acceptance: float = 0.3  # sources: the estimate before any verification
    shareable: bool = False  # sources: one instance may serve every slot of a decoder
    options: type[BaseModel] | None = None  # sources and topologies: the model their options are checked against
    short_name: str = ""  # sources: what a method name may call it (goose-bench's cm+bt@spine)
    beside: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)  # sources: source -> options
    needs_request: str = ""  # sources: the request input it drafts from alone ("prediction"); "": the context

    def __post_init__(self) -> None:
        if self.kind != "source" and (self.short_name or self.beside or self.needs_request):
            raise PluginError(f"{self.kind} {self.name!r}: short_name, beside and needs_request are for sources")
        if not isinstance(self.short_name, str) or not isinstance(self.beside, Mapping):
            raise PluginError(f"{self.kind} {self.name!r}: short_name must be a string, beside a mapping of source "
                              f"names to options")
        if self.needs_request not in ("", *REQUEST_INPUTS):
            raise PluginError(f"{self.kind} {self.name!r}: needs_request names a request input a source may draft "
                              f"from ({', '.join(REQUEST_INPUTS)}) or is empty, got {self.needs_request!r}")
        for options in self.beside.values():
            self.checked_options(options)
        if not 0.0 <= self.initial_acceptance <= 1.0:
            raise PluginError(f"{self.kind} {self.name!r}: initial_acceptance must lie in [0, 1], got "
                              f"{self.initial_acceptance}")
        if not isinstance(self.shareable, bool):
            raise PluginError(f"{self.kind} {self.name!r}: shareable must be True or False, got {self.shareable!r}")
        if self.options is not None and (self.kind == "command" or not (
                inspect.isclass(self.options) and issubclass(self.options, BaseModel))):
            raise PluginError(f"{self.kind} {self.name!r}: options must be a pydantic BaseModel subclass (sources and "
                              f"topologies only), got {self.options!r}")
        if inspect.isclass(self.factory) and self.kind != "command":  # a factory function: its product, when made
            Manager(self.factory, self.kind, self.name)

    def option_names(self) -> tuple[str, ...]:
        """The option keys the options model accepts (its fields, and their aliases); () without a model."""
        if self.options is None:
            return ()
        names = dict.fromkeys(self.options.model_fields)
        for info in self.options.model_fields.values():
            names.update(dict.fromkeys(a for a in (info.alias, info.validation_alias) if isinstance(a, str)))
        return tuple(names)

    def checked_options(self, given: Mapping[str, Any]) -> BaseModel | None:
        """``given`` (this plugin's ``source_options`` / ``topology_options`` entry) validated through the options
        model, unknown keys refused whatever the model's own ``extra``; None without a model (the factory reads
        them itself). PluginError names the unknown key and the known ones, or the bad value."""
        if self.options is None:
            return None
        where, known = f"{self.kind}_options.{self.name}", self.option_names()
        if not isinstance(given, Mapping):
            raise PluginError(f"{where}: options must be a mapping of option names to values, got "
                              f"{type(given).__name__}")
        unknown = [key for key in given if key not in known]
        if unknown:
            near = difflib.get_close_matches(str(unknown[0]), known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise PluginError(f"{where}: unknown option {unknown[0]!r} ({hint}known: {', '.join(known) or 'none'})")
        try:
            return self.options.model_validate(dict(given))
        except ValidationError as error:
            problem = error.errors(include_url=False)[0]
            path = "".join(f".{part}" for part in problem.get("loc", ()))
            raise PluginError(f"{where}{path}: {problem['msg'].removeprefix('Value error, ')}") from None


@dataclass
class Registry:
    """Every registered source, topology and command, by name."""

    sources: dict[str, Registration] = field(default_factory=dict)
    topologies: dict[str, Registration] = field(default_factory=dict)
    commands: dict[str, Registration] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)

    def needing(self, request_input: str) -> tuple[str, ...]:
        """The sources that draft from ``request_input`` alone (registered ``needs_request=request_input``), in
        registration order."""
        return tuple(name for name, r in self.sources.items() if r.needs_request == request_input)

    def add_plugin(self, plugin: object, origin: str, strict: bool = True) -> list[Registration]:
        """What one registration plugin registers; a bad one raises if ``strict``, else goes to ``load_errors``."""
        hooks = Manager(plugin, "registration", getattr(plugin, "__name__", type(plugin).__name__)).hook
        added: list[Registration] = []
        for kind, table in TABLES.items():
            getattr(hooks, f"goose_register_{table}")(register=partial(self._add, kind, origin, added, strict))
        return added

    def _add(self, kind: str, origin: str, added: list[Registration], strict: bool, name: str,
             factory: Callable[..., Any], **options: Any) -> None:
        """One ``register(name, factory, **options)`` call of a registration plugin."""
        table = getattr(self, TABLES[kind])
        try:
            if name in table and table[name].factory is not factory:
                raise PluginError(f"{kind} {name!r}: the name is taken by {table[name].origin}'s")
            short = options.get("short_name")
            if short and any(short in (r.name, r.short_name) for r in table.values() if r.name != name):
                raise PluginError(f"{kind} {name!r}: the short name {short!r} is taken")
            table[name] = Registration(name, kind, factory, origin, **options)
            added.append(table[name])
        except PluginError as error:
            if strict:
                raise
            self.load_errors.append(f"{error} (from {origin}: not registered)")
            logger.error("%s", self.load_errors[-1])

    def signatures(self, r: Registration) -> dict[str, tuple[str, ...]]:
        """The hooks a registration's class implements -> the arguments each asks for; {} for a factory function."""
        return Manager(r.factory, r.kind, r.name).implemented() if inspect.isclass(r.factory) else {}

    def lookup(self, kind: str, name: str, where: str = "") -> Registration:
        """The registration of ``name``; PluginError naming the registered ones (``where``: what named it)."""
        table = getattr(self, TABLES[kind])
        if name not in table:
            known = ", ".join(sorted(table)) or "none (is goose installed? run `pip install -e .`)"
            raise PluginError(f"{where}unknown {kind} {name!r}{did_you_mean(name, table)}; registered "
                              f"{TABLES[kind]}: {known}")
        return table[name]

    source, topology = partialmethod(lookup, "source"), partialmethod(lookup, "topology")

    def check_options(self, kind: str, config: GooseConfig) -> dict[str, BaseModel | None]:
        """Every ``source_options`` (``kind="source"``) or ``topology_options`` entry of ``config``: its name
        registered, its keys and values valid by the registration's options model (PluginError otherwise);
        name -> the validated options (None where the plugin declares no model)."""
        given: dict[str, dict[str, Any]] = getattr(config, f"{kind}_options")
        return {name: self.lookup(kind, name, f"{kind}_options: ").checked_options(options)
                for name, options in given.items()}


def registry(refresh: bool = False) -> Registry:
    """The process-wide registry, loaded from the ``goose`` entry-point group on first use."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = _load_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
    return _REGISTRY


def _load_entry_points(entry_points: Iterable[metadata.EntryPoint]) -> Registry:
    """Every entry point's registrations, built-ins first (their faults raise; others' go to ``load_errors``)."""
    found = Registry()
    unique = {(getattr(ep.dist, "name", "unknown"), ep.value): ep for ep in entry_points}  # editable installs: twice
    for (origin, _), entry_point in sorted(unique.items(), key=lambda at: (at[0][0] != OWN_DISTRIBUTION, at[1].name)):
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
    """Register a plugin module or object at run time; its registrations (for :func:`unregister`), or PluginError."""
    return registry().add_plugin(plugin, origin)


def unregister(registrations: list[Registration]) -> None:
    """Take out what :func:`register` added."""
    for r in registrations:
        if (table := getattr(registry(), TABLES[r.kind])).get(r.name) is r:
            del table[r.name]


class SourcePlugin:
    """A registration plugin for one source: ``register(SourcePlugin("name", Class, initial_acceptance=0.5))``
    (any ``register`` keyword: ``description``, ``shareable``, ``options=OptionsModel``)."""

    def __init__(self, name: str, factory: Callable[..., Any], **options: Any) -> None:
        self.arguments, self.options = (name, factory), options

    @hookspecs.hookimpl
    def goose_register_sources(self, register: hookspecs.Register) -> None:
        register(*self.arguments, **self.options)


__all__ = ["BUILTIN_ORIGIN", "ENTRY_POINT_GROUP", "OWN_DISTRIBUTION", "REQUEST_INPUTS", "Manager", "PluginError",
           "Registration", "Registry", "SourcePlugin", "register", "registry", "unregister"]
