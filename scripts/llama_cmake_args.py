"""The cmake arguments of a portable llama.cpp build for this CPU, and the instruction sets a build needs.

The Makefile builds llama-cpp-python and llama-server with what this prints (the standard library alone,
so ``python3`` runs it before any environment exists)::

    python3 scripts/llama_cmake_args.py [CPUINFO]            # -DGGML_NATIVE=OFF -DGGML_AVX=ON ... -DGGML_AMX_BF16=OFF
    python3 scripts/llama_cmake_args.py --needs ARG...       # avx2 fma f16c ...: what a build with ARGs executes

A portable build (``GGML_NATIVE=OFF``) names every x86 instruction set ggml can use, ON where /proc/cpuinfo
(or the file CPUINFO) lists all of its flags, OFF otherwise: with GGML_NATIVE=OFF ggml turns SSE 4.2, AVX,
AVX2, BMI2, FMA and F16C on by default, and an AVX2 build dies with SIGILL on a CPU without AVX2, as an
AVX-512 build does on one without AVX-512. Never ``-march=native`` (GGML_NATIVE=ON crashed inside
llama_decode on an AVX-512 EPYC) and never AMX (AMX builds died on an AMX Xeon): the AMX options are always
OFF. The option names are those of ggml/CMakeLists.txt in the llama.cpp that llama-cpp-python 0.3.36
vendors; the flags each turns on are its ggml/src/ggml-cpu/CMakeLists.txt's (GGML_AVX512: -mavx512f
-mavx512cd -mavx512vl -mavx512dq -mavx512bw).

``--needs`` reads cmake arguments (this script's or a user's own LLAMA_CMAKE_ARGS) and prints the
/proc/cpuinfo flags the build's code may execute, one line: the Makefile records it beside the build,
and goose refuses to load a build whose list names a flag the CPU lacks (goose/cpu.py) instead of dying
with SIGILL. An option left out takes ggml's default; a native build needs whatever this CPU has.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# ggml's x86 options, in ggml/CMakeLists.txt's order, and the /proc/cpuinfo flags each one's code executes
OPTIONS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_BMI2": ("bmi2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
    "GGML_AMX_TILE": ("amx_tile",),
    "GGML_AMX_INT8": ("amx_int8",),
    "GGML_AMX_BF16": ("amx_bf16",),
}
AMX = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")  # always OFF
AVX512_EXTENSIONS = ("GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")  # only beside GGML_AVX512
# ON by default where GGML_NATIVE is OFF (ggml's INS_ENB), the rest OFF
DEFAULT_ON = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C")
TRUE = {"on", "1", "yes", "true", "y"}


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The first ``flags`` line of ``cpuinfo`` (x86 Linux's /proc/cpuinfo format), as a set."""
    for line in cpuinfo.read_text(errors="replace").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return set(value.split())
    return set()


def cmake_args(flags: set[str]) -> list[str]:
    """A portable build's arguments naming exactly the instruction sets in ``flags``, AMX off."""
    args = ["-DGGML_NATIVE=OFF"]
    enabled: set[str] = set()
    for option, needed in OPTIONS.items():
        on = option not in AMX and all(flag in flags for flag in needed)
        if option in AVX512_EXTENSIONS:
            on = on and "GGML_AVX512" in enabled
        if on:
            enabled.add(option)
        args.append(f"-D{option}={'ON' if on else 'OFF'}")
    return args


def needs(args: list[str], flags: set[str]) -> list[str]:
    """The /proc/cpuinfo flags a build with cmake ``args`` executes (``flags``: this CPU's, for a native build)."""
    values: dict[str, bool] = {}
    for arg in args:
        match = re.fullmatch(r"-D(GGML_\w+?)(?::\w+)?=(.*)", arg)
        if match:
            values[match[1]] = match[2].strip().lower() in TRUE
    if values.get("GGML_NATIVE", True):  # -march=native: whatever this CPU has of ggml's instruction sets
        return [flag for needed in OPTIONS.values() for flag in needed if flag in flags]
    return [flag for option, needed in OPTIONS.items() if values.get(option, option in DEFAULT_ON) for flag in needed]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--needs"]:
        args = [word for arg in argv[1:] for word in arg.split()]
        try:
            flags = cpu_flags()
        except OSError:
            flags = set()
        print(" ".join(needs(args, flags)))
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: llama_cmake_args.py [CPUINFO] | --needs CMAKE_ARG...", file=sys.stderr)
        return 2
    path = Path(argv[0]) if argv else CPUINFO
    try:
        flags = cpu_flags(path)
    except OSError as error:
        print(f"llama_cmake_args.py: cannot read {path}: {error.strerror}", file=sys.stderr)
        return 1
    print(" ".join(cmake_args(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
