"""``llama_server_ngram``: llama.cpp's server with ``--spec-type ngram-mod`` as a peer of ``goose bench``. Its flags
and failures here; the real server where ``make llama-server`` has built it (``make test`` does)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from goose import cli, models
from goose_bench.llama_peer import LlamaBenchError, llama_peer, llama_server_binary, start_llama_session
from goose_bench.peers import llama_runner
from goose_bench.peers.llama_runner import SERVER_LOG
from goose_bench.peers.llama_server import LlamaServer, LlamaServerError, missing_instructions

LLAMA_BUILT = importlib.util.find_spec("llama_cpp") is not None  # `make llama-setup`
SERVER_BUILT = llama_server_binary().is_file()  # `make llama-server`
# a build for another CPU's instruction sets (its recorded flags) is refused by the runner or the server: skipped
SERVER_MISSING = missing_instructions(llama_server_binary())[0] if SERVER_BUILT else []
FOREIGN = llama_runner.llama_cpp_refusal() or (
    f"llama-server was built for instructions this CPU lacks: {' '.join(SERVER_MISSING)}; `make llama-server` "
    "rebuilds it for this CPU" if SERVER_MISSING else None)
needs_server = pytest.mark.skipif(not (SERVER_BUILT and LLAMA_BUILT) or FOREIGN is not None, reason=FOREIGN or
                                  "llama-server or llama-cpp-python is not built (`make test` builds both)")
THREADS = 1


# --- flags and failures, before any model loads -------------------------------------------------------


def test_llama_server_ngram_named_without_the_binary_is_a_one_line_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GOOSE_CACHE", str(tmp_path))  # an empty cache: no llama-server linked
    assert cli.main(["bench", "llama", "--datasets", "humaneval", "--out", str(tmp_path), "--python", sys.executable,
                     "--llama-methods", "llama,llama_server_ngram"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "llama_server_ngram: no llama-server at" in error
    assert "`make llama-server` builds it" in error


def test_llama_server_ngram_by_default_is_left_out_with_a_notice_where_not_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GOOSE_CACHE", str(tmp_path))
    assert llama_peer(sys.executable, ["smollm2-135m"]).methods == ("llama", "llama_pld")
    notice = capsys.readouterr().err.strip()
    assert notice.count("\n") == 0 and "llama_server_ngram left out" in notice and "make llama-server" in notice
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("")
    assert llama_peer(sys.executable, ["smollm2-135m"]).methods == llama_runner.METHODS
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("flags", "message"), [
    (["--python", sys.executable, "--llama-methods", "llama,nope"], "--llama-methods: unknown nope"),
])
def test_llama_methods_argument_errors(flags: list[str], message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "llama", "--datasets", "humaneval", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_runner_refuses_llama_server_ngram_without_a_binary(tmp_path: Path) -> None:
    """The real runner, stopped by its own argument check (before it imports llama_cpp)."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    command = [sys.executable, str(Path(llama_runner.__file__)), "--gguf", str(gguf), "--prompts", "p.json",
               "--methods", "llama_server_ngram", "--server", str(tmp_path / "none"), "--out", str(tmp_path)]
    with pytest.raises(LlamaBenchError, match="`make llama-server` builds it"):
        start_llama_session(command, tmp_path, progress=False)


def test_a_server_that_cannot_start_or_exits_at_once_is_an_error_naming_its_log(tmp_path: Path) -> None:
    with pytest.raises(LlamaServerError, match=r"cannot start .*`make llama-server` builds it"):
        LlamaServer(tmp_path / "none", [], tmp_path / "server.log").__enter__()
    with pytest.raises(LlamaServerError, match="exited with status 1 before it was ready") as failure:
        LlamaServer("false", [], tmp_path / "server.log").__enter__()
    assert str(tmp_path / "server.log") in str(failure.value)


# --- the real server -------------------------------------------------------------------------------


def _alive(port: int) -> bool:
    """Whether any process runs with ``--port port`` among its arguments."""
    for entry in Path("/proc").iterdir():
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone meanwhile
            continue
        if b"--port" in arguments and str(port).encode() in arguments:
            return True
    return False


def _llama_greedy(gguf: Path, ids: list[int], max_tokens: int, eos_ids: set[int]) -> list[int]:
    """llama-cpp-python's greedy decoding, as the runner's ``llama`` method runs it."""
    from llama_cpp import Llama

    llama = Llama(model_path=str(gguf), n_ctx=512, n_batch=512, n_threads=THREADS, n_threads_batch=THREADS, seed=0,
                  verbose=False)
    output: list[int] = []
    for token in llama.generate(ids, temp=0.0, repeat_penalty=1.0):
        output.append(int(token))
        if token in eos_ids or len(output) >= max_tokens:
            break
    return output


@pytest.mark.slow
@needs_server
def test_the_server_decodes_as_llama_cpp_and_is_stopped_even_on_an_error(tmp_path: Path) -> None:
    """SmolLM2's Q4_1 file through the server, greedy, as the runner starts it: its tokens are llama-cpp-python's
    greedy ones; the process is gone after the block, also when the block raises."""
    from llama_cpp import Llama

    gguf = models.gguf_path("smollm2-135m")
    text = b"<|im_start|>user\nWrite a Python function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n"
    ids = Llama(model_path=str(gguf), vocab_only=True, verbose=False).tokenize(text, add_bos=False, special=True)
    arguments = llama_runner.server_arguments(
        llama_runner.parse_arguments(["--gguf", str(gguf), "--prompts", "p.json", "--out", str(tmp_path),
                                      "--server", str(llama_server_binary())]),
        n_ctx=512, threads=THREADS)
    with LlamaServer(llama_server_binary(), arguments, tmp_path / "server.log") as server:
        process = server.process
        output, wall, prefill, (drafted, accepted) = server.complete(ids, 24)
    assert process is not None and process.poll() is not None
    assert output == _llama_greedy(gguf, ids, 24, {2}) and 0 < prefill < wall
    assert 0 <= accepted <= drafted
    with pytest.raises(KeyboardInterrupt), LlamaServer(llama_server_binary(), arguments, tmp_path / "server.log") \
            as server:
        process = server.process
        raise KeyboardInterrupt  # as Ctrl-C in the middle of a run
    assert process is not None and process.poll() is not None


@pytest.mark.slow
@needs_server
def test_goose_bench_runs_llama_server_ngram_beside_plain_llama_cpp(tmp_path: Path) -> None:
    """The bench's own path on SmolLM2: an edit (copy-heavy: the function to edit is in the prompt), 128 tokens.
    llama_server_ngram's texts equal plain llama.cpp's, it drafted and kept tokens, and every server it started is
    gone."""
    status = cli.main(["bench", "llama", "--model", "smollm2-135m", "--datasets", "edit", "--limit", "1",
                       "--max-new-tokens", "128", "--methods", "ar", "--dtype", "float32", "--threads", str(THREADS),
                       "--python", sys.executable, "--llama-methods", "llama,llama_server_ngram",
                       "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    results: dict[str, Any] = json.loads((tmp_path / "llama" / "results.json").read_text())
    assert results["methods"] == ["llama", "llama_server_ngram"]
    server = results["conditions"]["server"]
    assert Path(server["binary"]) == llama_server_binary().resolve() and "ngram-mod" in server["arguments"]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for generation in results["generations"]:
        by_method.setdefault(generation["method"], []).append(generation)
    plain, ngram = by_method["llama"], by_method["llama_server_ngram"]
    # a drafted token is kept only where it is the greedy choice, so the texts agree as long as a batch of rows
    # rounds as one row does (it does on these prompts; llama.cpp's CPU arithmetic is deterministic)
    assert [g["output"] for g in ngram] == [g["output"] for g in plain] and len(plain) == 1
    accepted = sum(g["accepted"] for g in ngram)
    assert 0 < accepted <= sum(g["drafted"] for g in ngram) and all(g["drafted"] is None for g in plain)
    section = json.loads((tmp_path / "summary.json").read_text())["llama"]
    assert section["identical_to_plain"] == {"llama_server_ngram": 1}
    assert section["drafts"]["llama_server_ngram"]["accepted"] == accepted
    assert "`llama_server_ngram` drafted" in (tmp_path / "report.md").read_text()
    # one server per run (a warm-up and the timed request), all of them stopped
    log = (tmp_path / "llama" / SERVER_LOG).read_text()
    ports = [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if line.startswith("goose: ")]
    assert len(ports) == 1 and not any(_alive(port) for port in ports)
