"""tasks/local/preflight.py: a --target local run that lacks tokenizers, vllm-router or vLLM's interpreter is told
so in one line naming the command that supplies it, before anything starts."""
import pytest

from epdbench.specs.models import load_spec, parse_spec
from epdbench.tasks.local.engine_env import EngineEnvError
from epdbench.tasks.local.preflight import PreflightError, preflight_local


def local_spec(**local):
    data = load_spec("cpu-tiny").model_dump(mode="json")
    data["target"]["kind"] = "local"
    data["target"]["local"].update(local)
    return parse_spec(data, "cpu-tiny")


def engine_ok(python, make):
    return "0.26.0"


def test_everything_there_gives_vllms_version_and_asks_the_interpreter_the_spec_names():
    asked = []
    version = preflight_local(local_spec(vllm_python="/envs/v/bin/python"), has_module=lambda name: True,
                              router=lambda: "/bin/vllm-router",
                              engine=lambda python, make: asked.append((python, make)) or "0.32.0")
    assert version == "0.32.0" and asked == [("/envs/v/bin/python", "epdbench engine-env")]


def test_the_tiny_model_without_tokenizers_names_the_local_extra():
    with pytest.raises(PreflightError) as e:
        preflight_local(local_spec(), has_module=lambda name: name != "tokenizers", router=lambda: "r",
                        engine=engine_ok)
    assert str(e.value) == ("target.local.tiny_model: epdbench makes the tiny model with `tokenizers`, which its "
                            "environment lacks: pip install -e '.[local]' (the local extra)")


def test_a_model_folder_needs_no_tokenizers_here():
    spec = local_spec(tiny_model=False, model_path="/models/qwen")
    assert preflight_local(spec, has_module=lambda name: False, router=lambda: "r", engine=engine_ok) == "0.26.0"


def test_no_router_binary_is_one_line():
    with pytest.raises(PreflightError, match=r"^vllm-router is not installed in epdbench's environment"):
        preflight_local(local_spec(), has_module=lambda name: True, router=lambda: None, engine=engine_ok)


def test_no_vllm_interpreter_names_the_flag_and_on_a_gpu_host_the_offline_bundle(tmp_path):
    def no_vllm(python, make):
        raise EngineEnvError(f"{python}: no such file; give the interpreter of a Python environment with vLLM "
                             f"(make one with: {make})")

    with pytest.raises(PreflightError) as cpu:
        preflight_local(local_spec(), has_module=lambda name: True, router=lambda: "r", engine=no_vllm)
    assert str(cpu.value).startswith("target.local.vllm_python (unset: the default) ")
    assert str(cpu.value).endswith("vllm-cpu/bin/python: no such file; give the interpreter of a Python environment "
                                   "with vLLM (make one with: epdbench engine-env)")
    gpu = local_spec(device="cuda", tiny_model=False, model_path="/models/qwen")
    with pytest.raises(PreflightError) as e:
        preflight_local(gpu, has_module=lambda name: True, router=lambda: "r", engine=no_vllm)
    assert "vllm-gpu/bin/python: no such file" in str(e.value)
    assert str(e.value).endswith("(make one with: epdbench engine-env --wheelhouse DIR on a machine with network, "
                                 "then DIR/install.sh on this host (docs/local-target.md))")


def test_no_router_binary_is_fine_when_every_configuration_takes_the_builtin_proxy():
    """The GPU bundle leaves vllm-router out: with target.local.router builtin (and for EPD) nothing runs it."""
    spec = local_spec(router="builtin")
    assert preflight_local(spec, has_module=lambda name: True, router=lambda: None, engine=engine_ok) == "0.26.0"
    with pytest.raises(PreflightError, match=r"in front of aggregated, pd-nixl-tcp\): .* or set target.local.router: "
                                             r"builtin$"):
        preflight_local(local_spec(), has_module=lambda name: True, router=lambda: None, engine=engine_ok)
