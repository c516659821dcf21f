"""A calibration you can trust: the curve's metadata, the signs of a busy machine, the cache keyed by the CPU's
features, and ``goose calibrate --show`` (the curves goose-bench ships: bench/tests/test_estimate.py)."""

from __future__ import annotations

import json
import logging

import pytest

from goose import cli
from goose.planning import cost, machine
from goose.planning.cost import CostCurve, CurveMeta

SIZES = (1, 2, 4, 8, 16, 32)
QUIET = (0.0689, 0.0896, 0.101, 0.130, 0.180, 0.290)  # SmolLM2-135M float32's shape, 2 threads


def _measured(seconds=QUIET, spread=0.02, raw=None, weight_bytes=538_000_000) -> CostCurve:
    """A curve as ``measure`` returns it: per size the samples, their median and spread."""
    raw = tuple(raw or seconds)
    spreads = (spread,) * len(SIZES) if isinstance(spread, float) else tuple(spread)
    samples = tuple(tuple(r * f for f in (0.99, 1.0, 1.01)) for r in raw)
    meta = CurveMeta(measured_at="2026-12-07T10:00:00+00:00", cpu="AMD EPYC", cpu_key="f0123abcd-cpus2",
                     cpu_features="AVX2, FMA, no AMX", threads=2, model="smollm2-135m", dtype="float32",
                     device="cpu", context_length=256, rounds=3, weight_bytes=weight_bytes, load_average=0.05,
                     raw_seconds=raw, spread=spreads, samples=samples, note="a test")
    return CostCurve(SIZES, tuple(seconds), meta)


def test_the_metadata_round_trips_through_the_file(tmp_path) -> None:
    curve = _measured()
    path = tmp_path / "curve.json"
    curve.save(path)
    loaded = CostCurve.load(path)
    assert loaded == curve and loaded.meta == curve.meta
    data = json.loads(path.read_text())
    assert data["format"] == cost.CURVE_FORMAT and data["meta"]["cpu_key"] == "f0123abcd-cpus2"
    assert data["meta"]["samples"][0] == pytest.approx([0.0689 * 0.99, 0.0689, 0.0689 * 1.01])


def test_a_file_of_sizes_and_seconds_alone_still_loads(tmp_path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"sizes": [1, 8, 64], "seconds": [0.05, 0.06, 0.2]}))
    curve = CostCurve.load(path)
    assert curve == CostCurve((1, 8, 64), (0.05, 0.06, 0.2)) and curve.meta is None
    assert cost.busy_signs(curve) == []  # judged on its shape alone, and it is a quiet shape


def test_a_quiet_curve_shows_no_sign_of_a_busy_machine() -> None:
    assert cost.busy_signs(_measured()) == []
    # a flat start (a GPU, or a bfloat16 1.5B on AVX-512) with a small dip inside the noise is quiet too
    flat = (0.187, 0.187, 0.198, 0.244, 0.279, 0.411)
    assert cost.busy_signs(_measured(flat, 0.05, raw=(0.195, 0.187, 0.198, 0.244, 0.279, 0.411))) == []
    # a machine 12x slower than this one is slow, not busy: t(1) 827 ms is within SmolLM2's bound (1096 ms)
    assert cost.busy_signs(_measured(tuple(12 * s for s in QUIET))) == []


@pytest.mark.parametrize(("curve", "sign"), [
    # half the sizes' samples spread over more than a quarter of their median
    (_measured(spread=(0.4, 0.1, 0.6, 0.3, 0.05, 0.02)), "spread (IQR/median) above 0.25 at 3 of 6 sizes, up to 0.60"),
    # a small tree timed far slower than a bigger one, beyond both sizes' noise
    (_measured(raw=(0.0689, 0.0896, 0.200, 0.130, 0.180, 0.290)), "t(4) measured 1.54x t(8), a bigger tree"),
    # two rows for the price of 2.9 one-row passes (the busy curve once cached: t(1) 511 ms, t(2)/t(1) 2.91)
    (_measured((0.511, 1.487, 1.50, 1.6, 1.9, 2.4)), "t(2) is 2.9x t(1), more than 2 one-row passes cost"),
    # one row slower than reading SmolLM2's 538 MB of weights at 0.5 GB/s (plus 20 ms)
    (_measured(tuple(20 * s for s in QUIET)),
     "t(1) 1378 ms, above the 1096 ms that reading 538 MB of weights takes at 0.5 GB/s"),
], ids=["spread", "dip", "superlinear", "t1-bound"])
def test_a_curve_measured_on_a_busy_machine_is_flagged(curve, sign) -> None:
    assert cost.busy_signs(curve) == [sign]


def test_a_busy_measurement_is_measured_again_then_cached_with_its_signs(tmp_path, caplog) -> None:
    path = tmp_path / "calibration" / "curve.json"
    busy = _measured(spread=0.5)
    calls = []

    def measured():
        calls.append(1)
        return busy

    quiet_now = lambda: False  # noqa: E731  (the machine's load now: retrying can help)
    with caplog.at_level(logging.WARNING, logger="goose.planning.cost"):
        kept = cost.cached(path, measured, busy=quiet_now)
    assert len(calls) == cost.TRIES and kept == busy and kept.meta.tries == cost.TRIES and kept.meta.problems
    assert CostCurve.load(path).meta.problems == kept.meta.problems  # cached with its signs, said in one line
    assert [r.getMessage() for r in caplog.records if "cached at" in r.getMessage() and "quiet" in r.getMessage()]
    assert cost.cached(path, measured, busy=quiet_now) is kept and len(calls) == cost.TRIES  # this process keeps it
    # a quiet second measurement is cached (and replaces the one this process kept)
    answers = iter([busy, _measured()])
    curve = cost.cached(path, lambda: next(answers), refresh=True, busy=quiet_now)
    assert path.exists() and curve.meta.tries == 2 and not curve.meta.problems
    assert CostCurve.load(path).meta == curve.meta


def test_on_a_busy_machine_one_measurement_and_the_busy_curve_is_reused(tmp_path, caplog) -> None:
    """A process that starts while others hold the cores measures once (more tries would be slowed alike), and a
    later process uses that curve as it is while the machine stays busy; the first quiet one measures it again."""
    path = tmp_path / "curve.json"
    calls = []

    def measured():
        calls.append(1)
        return _measured(spread=0.5)

    busy_now = lambda: True  # noqa: E731
    first = cost.cached(path, measured, busy=busy_now)
    assert len(calls) == 1 and first.meta.tries == 1 and first.meta.problems
    cost._UNCACHED.clear()  # another process
    with caplog.at_level(logging.WARNING, logger="goose.planning.cost"):
        again = cost.cached(path, measured, busy=busy_now)
    assert len(calls) == 1 and again.seconds == first.seconds
    assert "busy now: used as it is" in caplog.records[-1].getMessage()
    cost._UNCACHED.clear()
    quiet = cost.cached(path, _measured, busy=lambda: False)
    assert not quiet.meta.problems and not CostCurve.load(path).meta.problems


def test_a_cached_curve_that_looks_busy_is_measured_again(tmp_path, caplog) -> None:
    path = tmp_path / "curve.json"
    _measured(spread=0.5).save(path)
    with caplog.at_level(logging.WARNING, logger="goose.planning.cost"):
        curve = cost.cached(path, _measured, busy=lambda: False)
    assert curve.meta.spread[0] == 0.02 and CostCurve.load(path).meta.spread[0] == 0.02
    assert len(caplog.records) == 1 and "looks measured on a busy machine" in caplog.records[0].getMessage()


def test_a_curve_cached_by_the_cpu_name_alone_is_not_used(tiny, tmp_path, monkeypatch, caplog) -> None:
    from goose.cycle import calibration

    model, _ = tiny
    legacy = cost.curve_path(model, tmp_path, curve_format=6)
    path = cost.curve_path(model, tmp_path)
    assert legacy.name.startswith("v6-") and machine.features_key() not in legacy.name
    assert path.name.startswith(f"v{cost.CURVE_FORMAT}-") and machine.machine_key() in path.name
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"sizes": [1, 2], "seconds": [9.0, 9.0]}))
    monkeypatch.setattr(calibration, "measure", lambda model, *args, **kwargs: _measured())  # a stand-in: fast
    with caplog.at_level(logging.WARNING, logger="goose.planning.cost"):
        curve = calibration.load_or_measure(model, cache_dir=tmp_path)
    assert curve == _measured() and CostCurve.load(path) == curve
    assert [r.getMessage() for r in caplog.records] == [
        f"not using {legacy}: cached by the CPU's name alone (curve format 6), which two CPUs can share; "
        "measuring this machine's curve once"]


def test_measure_keeps_every_sample_and_says_where_and_how(tiny) -> None:
    from goose.cycle import calibration

    model, _ = tiny
    curve = calibration.measure(model, sizes=(1, 8, 64), rounds=3, context_length=64)
    meta = curve.meta
    assert [len(s) for s in meta.samples] == [3, 3, 3] and len(meta.spread) == 3 and all(s >= 0 for s in meta.spread)
    assert meta.raw_seconds == pytest.approx([sorted(s)[1] for s in meta.samples], abs=1e-6)  # the medians
    assert curve.seconds == tuple(float(s) for s in cost.monotone(list(meta.raw_seconds)))
    assert meta.cpu == machine.cpu_model() and meta.cpu_key == machine.machine_key() and meta.threads >= 1
    assert meta.model == "tiny-random-llama-0" and meta.dtype == "float32" and meta.device == "cpu"
    assert meta.weight_bytes == cost.weight_bytes(model) > 0 and meta.context_length == 64 and meta.rounds == 3


AVX512 = "fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx_vnni"
AVX2 = "fpu sse2 avx avx2 fma f16c"


def test_the_cache_key_tells_two_cpus_of_one_name_apart(tiny, tmp_path, monkeypatch) -> None:
    model, _ = tiny
    keys = {}
    for name, flags in (("avx512", AVX512), ("avx2", AVX2), ("avx2, flags reordered", "f16c fma sse2 avx2 fpu avx")):
        info = tmp_path / f"cpuinfo-{len(keys)}"
        info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n")
        monkeypatch.setattr(machine, "CPUINFO", info)
        machine.cpu_model.cache_clear()
        keys[name] = cost.cache_key(model)
    machine.cpu_model.cache_clear()
    assert all("AMD_EPYC" in key for key in keys.values())
    assert keys["avx512"] != keys["avx2"] == keys["avx2, flags reordered"]
    assert machine.speed_flags(AVX512) == ("avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f",
                                           "avx_vnni", "f16c", "fma")  # sse2 and fpu set no kernel apart
    assert machine.describe_features(machine.speed_flags(AVX512)) == \
        "AVX-512 (bf16 vnni), AVX2, FMA, F16C, AVX-VNNI, no AMX"


def test_goose_calibrate_measures_then_shows_the_cached_curve(tiny, tmp_path, monkeypatch, capsys) -> None:
    model, tokenizer = tiny
    folder = tmp_path / "tiny-model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    monkeypatch.setenv("GOOSE_CACHE", str(tmp_path / "cache"))
    # the tiny model's passes take a millisecond or two: while the rest of the suite runs they can look busy
    monkeypatch.setattr(cost, "busy_signs", lambda curve: [])
    argv = ["calibrate", "--model", str(folder), "--dtype", "float32"]
    assert cli.main([*argv, "--show"]) == 1
    assert "no verify cost curve is cached" in capsys.readouterr().err
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert cli.main([*argv, "--show"]) == 0
    again = capsys.readouterr().out
    assert again == printed  # the same report, from the file
    lines = dict(line.split(None, 1) for line in again.splitlines()[1:6])
    assert lines["file"].startswith(str(tmp_path / "cache" / "calibration" / f"v{cost.CURVE_FORMAT}-"))
    assert machine.cpu_model() in lines["cpu"] and machine.machine_key() in lines["cpu"]
    assert lines["checks"] == "no sign of a busy machine" and "IQR/median" in lines["spread"]
    assert again.splitlines()[6].split() == ["tree", "nodes", "ms", "x", "one", "token", "spread"]
    assert cli.main([*argv, "--show", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cached"] is True and report["meta"]["threads"] and len(report["meta"]["samples"]) == 12


def test_busy_now_sees_other_processes_not_this_one() -> None:
    """Another process spinning on a core is seen (its share of the CPUs); this process's own work is not."""
    import subprocess
    import sys

    from goose.planning import machine

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time_left = 50
        while time_left and (share := machine.others_share(0.5)) is not None and share < 0.8 / machine.cpu_count():
            time_left -= 1  # the spinner's interpreter is still starting
        assert share is not None and share >= 0.8 / machine.cpu_count()
        assert cost.busy_now() or machine.cpu_count() > 4
    finally:
        spinner.kill()
        spinner.wait()


def test_a_curve_busy_in_every_quiet_try_is_the_machines_own_noise_and_kept(tmp_path) -> None:
    path = tmp_path / "curve.json"
    calls = []

    def measured():
        calls.append(1)
        return _measured(spread=0.5)

    noisy = cost.cached(path, measured, busy=lambda: False)
    assert len(calls) == cost.TRIES and noisy.meta.tries == cost.TRIES and noisy.meta.problems
    cost._UNCACHED.clear()  # another process, the machine quiet: the noise is the machine's, not measured again
    assert cost.cached(path, measured, busy=lambda: False).seconds == noisy.seconds and len(calls) == cost.TRIES
