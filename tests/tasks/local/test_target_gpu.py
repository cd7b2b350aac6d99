"""tasks/local/target.py on a GPU host, its processes faked (no GPU here): engines sharing GPU 0 start together once
sized (encode first, alone) or one after another, EPD gets its encoder-output folder (removed at the end) and
epdbench's proxy in front, with the real-shapes model made in the results folder."""
from __future__ import annotations

import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from epdbench.specs.models import load_spec, parse_spec
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.local import target


def gpu_spec(ec_dir: Path, **local):
    data = load_spec("gpu-qwen25vl").model_dump(mode="json")
    data["target"]["local"].update(vllm_python=sys.executable, ec_shared_dir=str(ec_dir), **local)
    return parse_spec(data, "gpu-qwen25vl")


class FakePopen:
    pid = 0

    def poll(self):
        return None


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> Path:
    """One cache folder for the module's starts: the real-shapes model's tokenizer is converted once (seconds on 2
    cores), not in every test."""
    return tmp_path_factory.mktemp("cache")


def start_faked(monkeypatch, tmp_path: Path, config: str, cache: Path | None = None, **local) -> tuple:
    """target.start of gpu-qwen25vl's `config` with its processes faked: the deployment, what happened in order
    (spawn with its command line and environment, healthy, router with its command line, stop) and the run folder."""
    events: list = []
    monkeypatch.setattr(target, "vllm_version", lambda python, make=None: "0.26.0")
    monkeypatch.setattr(target, "spawn", lambda cmd, log, env, what: events.append(("spawn", what, cmd, env))
                        or FakePopen())
    monkeypatch.setattr(target, "wait_healthy", lambda procs, deadline, interval_s=0.2:
                        events.append(("healthy", [p.name for p in procs])))
    monkeypatch.setattr(target, "serve_through_router", lambda dep, cmd, env, url, metrics, *rest:
                        events.append(("router", cmd, metrics)) or dep)
    monkeypatch.setattr(target, "stop_deployment", lambda dep, grace_s: events.append(("stop",)))
    run = tmp_path / "run"
    run.mkdir()
    spec = gpu_spec(tmp_path / "shm", **local)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache or tmp_path / "cache"))
    return target.start(spec, spec.configuration(config), run / "spec.yaml", run / "logs"), events, run


@pytest.fixture(params=[True, False], ids=["together", "one-after-another"])
def started(monkeypatch, tmp_path, request, cache_home):
    return *start_faked(monkeypatch, tmp_path, "epd", cache_home, start_together=request.param), request.param


def test_engines_sharing_a_gpu_start_together_once_sized_else_one_after_another(started):
    """start_together: the encode engine first and alone (vLLM profiles it), then prefill and decode at once, each
    with its KV cache's size and its own compile cache; off: one after another, each healthy before the next."""
    dep, events, _, together = started
    kinds = [(e[0], e[1]) if e[0] == "spawn" else (e[0], tuple(e[1])) if e[0] == "healthy" else (e[0],)
             for e in events]
    if together:
        assert kinds == [("spawn", "epd/encode-0"), ("healthy", ("encode-0",)), ("spawn", "epd/prefill-0"),
                         ("spawn", "epd/decode-0"), ("healthy", ("encode-0", "prefill-0", "decode-0")), ("router",)]
    else:
        assert kinds == [("spawn", "epd/encode-0"), ("healthy", ("encode-0",)), ("spawn", "epd/prefill-0"),
                         ("healthy", ("prefill-0",)), ("spawn", "epd/decode-0"), ("healthy", ("decode-0",)),
                         ("healthy", ("encode-0", "prefill-0", "decode-0")), ("router",)]
    spawned = {e[1].split("/")[1]: e for e in events if e[0] == "spawn"}
    assert all(e[3]["CUDA_VISIBLE_DEVICES"] == "0" for e in spawned.values())
    for name, (_, _, cmd, env) in spawned.items():
        sized = "--kv-cache-memory-bytes" in cmd
        assert sized == (together and name != "encode-0"), name
        assert env.get("VLLM_CACHE_ROOT", "").endswith(f"vllm/epdbench/{name}") == together, name
    assert dep.router == "epdbench-proxy"


def test_epd_gets_its_own_encoder_output_folder_and_the_proxy_in_front(started):
    dep, events, run, _ = started
    assert dep.ec_dir.is_dir() and dep.ec_dir.parent == run.parent / "shm" and dep.ec_dir.name.endswith("-epd")
    encode = next(e[2] for e in events if e[0] == "spawn" and e[1] == "epd/encode-0")
    assert str(dep.ec_dir) in encode[encode.index("--ec-transfer-config") + 1]
    assert encode[encode.index("--model") + 1] == str(run / "real-shapes-model")
    assert (run / "real-shapes-model" / "tokenizer.json").exists()
    router = next(e for e in events if e[0] == "router")
    assert router[1][:4] == [sys.executable, "-P", "-m", "epdbench.sim.proxy"]
    assert [a for a in router[1] if a.startswith("--")] == ["--host", "--port", "--encode", "--prefill", "--decode"]
    assert router[2].endswith("/metrics")
    # started from a checkout of epdbench (its own epdbench/ folder in the working directory, as on a GPU host
    # where the package is installed, not linked), the proxy is still the installed one's
    shadow = run.parent / "checkout"
    (shadow / "epdbench" / "sim").mkdir(parents=True)
    for name in ("__init__.py", "sim/__init__.py"):
        (shadow / "epdbench" / name).write_text("")
    (shadow / "epdbench" / "sim" / "proxy.py").write_text("raise SystemExit('the checkout shadowed the package')")
    proc = subprocess.run([*router[1][:4], "--help"], cwd=shadow, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--encode" in proc.stdout, proc.stderr[-2000:]
    target.stop(dep)
    assert not dep.ec_dir.exists()


def test_a_start_that_fails_or_is_interrupted_stops_its_engines_within_the_short_grace(monkeypatch, tmp_path,
                                                                                        cache_home):
    """vLLM's API server ignores SIGTERM until it has started: a start that fails (or a Ctrl-C while engines
    profile) kills their groups after STARTING_STOP_GRACE_S, not the 30 s a serving engine gets to drain."""
    graces = []
    monkeypatch.setattr(target, "stop_deployment", lambda dep, grace_s: graces.append(grace_s))

    def interrupted(procs, deadline, interval_s=0.2):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, "wait_healthy", interrupted)
    monkeypatch.setattr(target, "vllm_version", lambda python, make=None: "0.26.0")
    monkeypatch.setattr(target, "spawn", lambda cmd, log, env, what: FakePopen())
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    (tmp_path / "run").mkdir()
    spec = gpu_spec(tmp_path / "shm")
    with pytest.raises(KeyboardInterrupt):
        target.start(spec, spec.configuration("pd-nixl-tcp"), tmp_path / "run" / "spec.yaml", tmp_path / "run" / "logs")
    assert graces == [target.STARTING_STOP_GRACE_S] and target.STARTING_STOP_GRACE_S < target.STOP_GRACE_S


def test_a_shared_folder_without_room_is_refused_in_one_line(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(target.shutil, "disk_usage", lambda path: usage(64e6, 0, 64e6))
    spec = gpu_spec(tmp_path / "shm")
    with pytest.raises(ProvisionError) as e:
        target.ec_shared_dir(spec, spec.configuration("epd"), tmp_path)
    assert str(e.value) == (f"target.local.ec_shared_dir: 0.06 GB free under {tmp_path / 'shm'}, less than 1 GB for "
                            "the encoder outputs (a container's /dev/shm is 64 MB unless --shm-size raises it): give "
                            "a folder with room")
    assert list((tmp_path / "shm").iterdir()) == []
