"""This machine's CPU: its instruction sets as /proc/cpuinfo names them, and whether a native build can run on it.

The one place goose reads /proc/cpuinfo (goose.planning.machine keys cost curves by what it reads here;
the llama.cpp peers, which run without goose, read it themselves).

llama.cpp is compiled here for the CPU that builds it (scripts/llama_cmake_args.py): a build records the
instruction sets its code executes (``avx2 fma f16c avx512f ...``, one line, /proc/cpuinfo's names) in a
file beside it, and :func:`refusal` turns a build that needs what this CPU lacks into a one-line error
before the library is loaded or the server started, where running it would die with SIGILL ("Illegal
instruction", exit 132). Where no such file exists nothing is checked.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from collections.abc import Iterable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# the x86 instruction sets a llama.cpp (ggml) or oneDNN build chooses between: a CPU kind is these flags
KIND_FLAGS = ("sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx_vnni", "avx512f", "avx512cd", "avx512vl",
              "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpuinfo_field(name: str, cpuinfo: Path = CPUINFO) -> str | None:
    """The value of the first ``name : value`` line of ``cpuinfo``, or None (no such line, or unreadable)."""
    try:
        with cpuinfo.open(errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=8)
def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The instruction-set flags of ``cpuinfo``'s first processor (x86: ``flags``; ARM: ``Features``); empty
    where there is no such file."""
    value = cpuinfo_field("flags", cpuinfo)
    if value is None:
        value = cpuinfo_field("Features", cpuinfo) or ""
    return frozenset(value.split())


@functools.lru_cache(maxsize=8)
def cpu_name(cpuinfo: Path = CPUINFO) -> str:
    """The processor's model name (``AMD EPYC``; ARM: the ``Hardware`` line), else the platform's processor
    string, else ``cpu``. goose.planning.machine keys cost curves by it: a change here moves every cached curve."""
    return cpuinfo_field("model name", cpuinfo) or cpuinfo_field("Hardware", cpuinfo) or platform.processor() or "cpu"


def cpu_kind(cpuinfo: Path = CPUINFO) -> str:
    """A short stable key of what a build for this CPU may use: the machine and a hash of :data:`KIND_FLAGS`
    present (``x86_64-3f2a9c01``): the same for every CPU that a native build runs on alike."""
    flags = cpu_flags(cpuinfo)
    present = " ".join(flag for flag in KIND_FLAGS if flag in flags)
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(present.encode()).hexdigest()[:8]}"


def missing_for(required: Iterable[str], flags: Iterable[str] | None = None) -> list[str]:
    """The flags of ``required`` that ``flags`` (default: this CPU's) lacks, in ``required``'s order, once each."""
    have = cpu_flags() if flags is None else frozenset(flags)
    return list(dict.fromkeys(flag for flag in required if flag not in have))


def recorded_flags(path: Path) -> list[str] | None:
    """The instruction sets a build recorded at ``path`` (whitespace-separated), or None where it recorded none."""
    try:
        return path.read_text().split()
    except (FileNotFoundError, NotADirectoryError):
        return None


def refusal(what: str, flags_file: Path, rebuild: str, flags: Iterable[str] | None = None) -> str | None:
    """The one-line error for ``what`` (a build whose needs are recorded at ``flags_file``) where this CPU (or
    ``flags``) lacks any of them; None where it has them all or nothing was recorded."""
    required = recorded_flags(flags_file)
    if not required:
        return None
    missing = missing_for(required, flags)
    if not missing:
        return None
    return (f"{what} was built for instructions this CPU ({cpu_name()}) lacks: {' '.join(missing)} "
            f"(recorded in {flags_file}); `{rebuild}` rebuilds it for this CPU")


__all__ = ["cpu_flags", "cpu_kind", "cpu_name", "missing_for", "refusal"]
