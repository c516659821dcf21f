"""Which machine a cost curve was measured on: the CPU's model name and a key of the features that set its speed.

A CPU's name does not say what it computes with: "AMD EPYC" is the name a VM reports for an EPYC with
AVX-512 (VNNI, BF16) and for one with AVX2 only, and their verify cost curves differ severalfold. So a
curve is keyed by the CPU's *features* as well: a short hash of the instruction-set flags that the
numeric kernels choose between (AVX, AVX2, FMA, F16C, every AVX-512 and AMX extension, AVX-VNNI; on
ARM NEON, SVE, dot products, BF16 and int8 matrix multiply), and by how many CPUs this process may run
on (a 2-CPU and a 16-CPU slice of the same chip share its flags, not its memory bandwidth or its noise).
The name and the flags are goose.cpu's reading of :data:`CPUINFO`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from pathlib import Path

from goose import cpu

CPUINFO = cpu.CPUINFO  # read at each call: a test points it at another CPU's file
# the flags the numeric kernels (oneDNN, MKL, llama.cpp's ggml) dispatch on; "avx512*" and "amx*" are prefixes
SPEED_FLAGS = frozenset({"avx", "avx2", "fma", "f16c", "avx_vnni", "avx_vnni_int8", "avx_ifma", "avx_ne_convert",
                         # ARM (the "Features" line)
                         "asimd", "asimddp", "asimdhp", "fphp", "bf16", "i8mm", "sve", "sve2", "sme"})
SPEED_PREFIXES = ("avx512", "amx")


@functools.cache
def cpu_model() -> str:
    """This machine's processor model as the OS names it ("AMD EPYC"); the platform's word where there is none."""
    return cpu.cpu_name(CPUINFO)


def speed_flags(flags: str | None = None) -> tuple[str, ...]:
    """The sorted flags of ``flags`` (a cpuinfo flags line; default: this CPU's) that the kernels' speed depends on."""
    chosen = cpu.cpu_flags(CPUINFO) if flags is None else flags.split()
    return tuple(sorted({f for f in chosen if f in SPEED_FLAGS or f.startswith(SPEED_PREFIXES)}))


def features_key(flags: tuple[str, ...] | None = None) -> str:
    """8 hex digits of the sorted speed flags: the part of a cache key that tells two CPUs of one name apart."""
    chosen = speed_flags() if flags is None else tuple(sorted(flags))
    return hashlib.sha256(" ".join(chosen).encode()).hexdigest()[:8]


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_key(flags: tuple[str, ...] | None = None) -> str:
    """``f<features_key>-cpus<n>``: what a cost curve's cache key adds to the CPU's name."""
    return f"f{features_key(flags)}-cpus{cpu_count()}"


def describe_features(flags: tuple[str, ...] | None = None) -> str:
    """The speed flags in a line: ``AVX-512 (bf16 vnni ...), AVX2, FMA, F16C, AVX-VNNI, no AMX``."""
    chosen = speed_flags() if flags is None else tuple(sorted(flags))
    if not chosen:
        return "no vector extensions the kernels use" if platform.machine() in ("x86_64", "AMD64") else "none listed"
    if not any(f.startswith("avx") for f in chosen):  # ARM and the like: the flags as listed
        return " ".join(chosen)
    avx512 = [f.removeprefix("avx512").lstrip("_") for f in chosen if f.startswith("avx512")]
    words = []
    if avx512:
        extras = sorted(f for f in avx512 if f not in ("f", "cd", "bw", "dq", "vl"))
        words.append(f"AVX-512 ({' '.join(extras)})" if extras else "AVX-512")
    words += [name for flag, name in (("avx2", "AVX2"), ("fma", "FMA"), ("f16c", "F16C"), ("avx_vnni", "AVX-VNNI"))
              if flag in chosen]
    amx = [f.removeprefix("amx").lstrip("_") for f in chosen if f.startswith("amx")]
    words.append(f"AMX ({' '.join(amx)})" if amx else "no AMX")
    return ", ".join(words)


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): how busy the machine was when a curve was measured."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def others_share(window: float = 0.5) -> float | None:
    """The share of every usable CPU's time that other processes took over the next ``window`` seconds (None
    where /proc/stat is unreadable). Unlike the load average, this process's own work (a measurement just
    taken, a model just loaded) does not count: what matters is whether others would slow the next one."""
    def ticks() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    hertz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    before, own_before = ticks(), sum(os.times()[:2])
    if before is None:
        return None
    time.sleep(window)
    after, own_after = ticks(), sum(os.times()[:2])
    if after is None or after[1] <= before[1]:
        return None
    others = (after[0] - before[0]) - (own_after - own_before) * hertz
    return max(0.0, others / (after[1] - before[1]))


__all__ = ["cpu_count", "cpu_model", "describe_features", "features_key", "load_average", "machine_key", "others_share",
           "speed_flags"]
