"""llama.cpp builds for the CPU they run on: scripts/llama_cmake_args.py names this CPU's instruction sets for
the build, the build records the ones it needs, and goose refuses a build that needs what the CPU lacks (one
line, before the library loads or the server starts) instead of dying with SIGILL. No model is loaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from goose import cpu, llama_model
from goose.llama_model import LlamaEngineError
from goose_bench.peers import llama_server
from goose_bench.peers.llama_server import LlamaServer, LlamaServerError
from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "llama_cmake_args.py"
# /proc/cpuinfo's flags of the project's three machine kinds (abridged to what a build chooses between)
ZEN3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 bmi1 bmi2 fma f16c aes sha_ni"
EPYC_AVX512 = ZEN3 + (" avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni"
                      " avx512_bf16 avx_vnni")
XEON_AMX = EPYC_AVX512 + " avx512_fp16 amx_bf16 amx_tile amx_int8"
AVX512_ARGS = ("-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON")
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


def _cpuinfo(tmp_path: Path, flags: str, name: str = "AMD EPYC") -> Path:
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: {name}\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nmodel name\t: {name}\nflags\t\t: {flags}\n")
    return path


def _script(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


# --- goose.cpu ----------------------------------------------------------------------------------------


def test_this_machines_flags_name_and_kind() -> None:
    flags = cpu.cpu_flags()
    assert "avx2" in flags and "fma" in flags and "f16c" in flags  # every CI machine kind has AVX2
    assert cpu.cpu_name() and "\n" not in cpu.cpu_name()
    assert cpu.cpu_kind() == cpu.cpu_kind() and cpu.cpu_kind().count("-") >= 1


def test_flags_name_and_kind_of_a_cpuinfo_file(tmp_path: Path) -> None:
    zen3, epyc, xeon = (_cpuinfo(tmp_path, flags) for flags in (ZEN3, EPYC_AVX512, XEON_AMX))
    assert cpu.cpu_flags(zen3) == frozenset(ZEN3.split()) and "avx512f" not in cpu.cpu_flags(zen3)
    assert cpu.cpu_name(zen3) == "AMD EPYC"
    kinds = {cpu.cpu_kind(path) for path in (zen3, epyc, xeon)}
    assert len(kinds) == 3  # the same name, three kinds
    assert cpu.cpu_kind(_cpuinfo(tmp_path, ZEN3 + " rdrand ht")) == cpu.cpu_kind(zen3)  # flags no build uses
    assert cpu.cpu_flags(tmp_path / "absent") == frozenset()


def test_missing_for_names_what_a_cpu_lacks_in_order() -> None:
    have = ZEN3.split()
    assert cpu.missing_for(["avx2", "fma", "f16c"], have) == []
    assert cpu.missing_for(["avx2", "avx512f", "fma", "avx512_vnni", "avx512f"], have) == ["avx512f", "avx512_vnni"]
    assert cpu.missing_for([], have) == []
    assert cpu.missing_for(["avx2"]) == []  # this CPU's own flags by default


def test_refusal_of_a_recorded_build(tmp_path: Path) -> None:
    record = tmp_path / "flags"
    assert cpu.refusal("x", record, "make x", flags=ZEN3.split()) is None  # nothing recorded: nothing checked
    record.write_text("sse4_2 avx avx2 fma f16c\n")
    assert cpu.refusal("x", record, "make x", flags=ZEN3.split()) is None
    record.write_text("avx2 avx512f avx512bw avx512_vnni\n")
    message = cpu.refusal("x", record, "make x", flags=ZEN3.split())
    assert message is not None and "\n" not in message
    assert "lacks: avx512f avx512bw avx512_vnni" in message and "`make x` rebuilds it for this CPU" in message


# --- the refusals before llama.cpp runs ----------------------------------------------------------------


@pytest.fixture
def zen3_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process sees the AVX2-only EPYC's flags (goose.cpu and the server's own reading)."""
    path = _cpuinfo(tmp_path, ZEN3)
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo=path: frozenset(ZEN3.split()))
    monkeypatch.setattr(llama_server, "CPUINFO", path)
    return path


def test_llama_cpp_built_for_other_instructions_is_refused_before_it_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zen3_cpu: Path) -> None:
    record = tmp_path / "goose-llama-cpu-flags"
    record.write_text("sse4_2 avx avx2 fma f16c amx_tile avx512f\n")
    monkeypatch.setenv(llama_model.CPU_FLAGS_VARIABLE, str(record))
    monkeypatch.setattr(llama_model, "_state", {})  # as in a process that has not loaded llama_cpp yet
    assert llama_model.cpu_flags_file() == record
    with pytest.raises(LlamaEngineError) as refused:
        llama_model.bindings()
    message = str(refused.value)
    assert "\n" not in message and message.startswith("llama-cpp-python was built for instructions this CPU")
    assert "lacks: amx_tile avx512f" in message and str(record) in message and "`make llama-setup`" in message
    assert "module" not in llama_model._state


def test_the_default_record_is_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(llama_model.CPU_FLAGS_VARIABLE, raising=False)
    assert llama_model.cpu_flags_file() == Path(sys.prefix) / "goose-llama-cpu-flags"


def test_the_installed_build_runs_here() -> None:
    """Where `make llama-setup` installed llama-cpp-python, its record needs nothing this CPU lacks."""
    record = llama_model.cpu_flags_file()
    if not record.is_file():
        pytest.skip(f"no record at {record} (`make llama-setup` writes it)")
    required = record.read_text().split()
    assert "avx2" in required and not {"amx_tile", "amx_int8", "amx_bf16"} & set(required)
    assert cpu.missing_for(required) == []


def test_llama_server_built_for_other_instructions_is_refused_before_it_starts(tmp_path: Path,
                                                                               zen3_cpu: Path) -> None:
    build = tmp_path / "llama-server-0.3.36-0123456789ab"
    build.mkdir()
    (build / "llama-server").write_text("#!/bin/sh\nexit 132\n")
    (build / "llama-server").chmod(0o755)
    (build / "cpu-flags").write_text("sse4_2 avx avx2 fma f16c avx512f amx_tile\n")
    link = tmp_path / "bin" / "llama-server"
    link.parent.mkdir()
    link.symlink_to(build / "llama-server")
    server = LlamaServer(link, ["-m", "model.gguf"], tmp_path / "server.log")
    with pytest.raises(LlamaServerError) as refused:
        server.start()
    message = str(refused.value)
    assert "\n" not in message and "lacks: avx512f amx_tile" in message and "`make llama-server`" in message
    assert server.process is None and not (tmp_path / "server.log").exists()  # never started
    (build / "cpu-flags").write_text("sse4_2 avx avx2 fma f16c\n")
    assert llama_server.missing_instructions(link) == ([], build / "cpu-flags")
    (build / "cpu-flags").unlink()
    assert llama_server.missing_instructions(link) == ([], None)  # no record: started as it is


# --- scripts/llama_cmake_args.py and the Makefile ----------------------------------------------------


def test_cmake_args_name_avx512_iff_this_cpu_has_it() -> None:
    args = _script().split()
    assert args[0] == "-DGGML_NATIVE=OFF" and all(arg in args for arg in AMX_OFF)
    has_avx512 = "avx512f" in cpu.cpu_flags()
    assert ("-DGGML_AVX512=ON" in args) == has_avx512 and ("-DGGML_AVX512=OFF" in args) == (not has_avx512)
    assert "-DGGML_AVX2=ON" in args and "-DGGML_FMA=ON" in args and "-DGGML_F16C=ON" in args


def test_cmake_args_of_the_three_machine_kinds(tmp_path: Path) -> None:
    zen3 = _script(str(_cpuinfo(tmp_path, ZEN3))).split()
    assert "-DGGML_AVX2=ON" in zen3 and "-DGGML_FMA=ON" in zen3 and "-DGGML_F16C=ON" in zen3
    assert "-DGGML_AVX512=OFF" in zen3 and "-DGGML_AVX_VNNI=OFF" in zen3
    assert not [arg for arg in zen3 if "AVX512" in arg and arg.endswith("=ON")]
    epyc = _script(str(_cpuinfo(tmp_path, EPYC_AVX512))).split()
    assert all(arg in epyc for arg in AVX512_ARGS) and "-DGGML_AVX_VNNI=ON" in epyc
    xeon = _script(str(_cpuinfo(tmp_path, XEON_AMX))).split()
    assert all(arg in xeon for arg in (*AVX512_ARGS, *AMX_OFF))  # AMX never, even where the CPU has it
    for args in (zen3, epyc, xeon):
        assert args[0] == "-DGGML_NATIVE=OFF" and all(arg in args for arg in AMX_OFF)
    assert _script("--needs", " ".join(zen3)).split() == ["sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"]
    needs = _script("--needs", " ".join(xeon)).split()
    assert "avx512f" in needs and "avx512_vnni" in needs and not [flag for flag in needs if flag.startswith("amx")]
    assert cpu.missing_for(needs, XEON_AMX.split()) == [] and "avx512f" in cpu.missing_for(needs, ZEN3.split())


def test_needs_fills_in_ggmls_defaults() -> None:
    """Options left out take ggml's defaults (with GGML_NATIVE=OFF: SSE 4.2 to F16C on), e.g. the old fixed args."""
    old = "-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    assert _script("--needs", old).split() == ["sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx512f", "avx512cd",
                                               "avx512vl", "avx512dq", "avx512bw"]
    assert _script("--needs", "-DGGML_NATIVE=OFF -DGGML_AVX2:BOOL=off -DGGML_AVX=OFF").split() == [
        "sse4_2", "bmi2", "fma", "f16c"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_makefile_builds_with_the_scripts_args_unless_told_otherwise() -> None:
    def make(*args: str) -> str:
        return subprocess.run(["make", "-s", "--no-print-directory", "--eval", "args: ; @echo $(LLAMA_CMAKE_ARGS)",
                               *args, "args"], cwd=REPO, capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()

    assert make() == _script()
    assert make("LLAMA_CMAKE_ARGS=-DGGML_NATIVE=OFF -DGGML_AVX2=ON") == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
