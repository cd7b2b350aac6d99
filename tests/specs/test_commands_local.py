"""specs/commands.py for the local target: the engines' command lines are the manifests' own (one source), on
loopback, with what a CPU host and the evidence need."""
import json
import logging

import pytest

from epdbench.analysis.logformats import parse_line
from epdbench.specs.commands import (LOCAL_UCX_TLS, VLLM_LOG_FORMAT, VLLM_LOGGING_CONFIG, engine_args,
                                     local_cpu_binds, local_engine_args, local_engine_env, local_gpus)
from epdbench.specs.models import load_spec, parse_spec


@pytest.fixture(scope="module")
def spec():
    return load_spec("cpu-tiny")


def test_local_engine_args_are_the_manifests_own_on_a_loopback_port(spec):
    config = spec.configuration("pd-nixl-tcp")
    for role in config.roles:
        local = local_engine_args(spec, config, role, model="/run/tiny-model", port=8123)
        assert local[:8] == ["--model", "/run/tiny-model", "--host", "127.0.0.1", "--port", "8123",
                             "--served-model-name", spec.model.name]
        assert local[-3:] == ["--load-format", "dummy", "--enforce-eager"]
        shared = engine_args(spec, config, role, extra_args=())[5:]      # past the model, host and port
        kv_at = shared.index("--kv-transfer-config") + 1
        assert local[8:-3][:kv_at] == shared[:kv_at]
        kv = json.loads(local[8 + kv_at])
        assert kv == {**json.loads(shared[kv_at]), "kv_buffer_device": "cpu"}
        assert kv["kv_role"] == ("kv_producer" if role.role == "prefill" else "kv_consumer")


def test_the_engines_environment_holds_nixl_to_its_transport_and_logs_what_the_verifiers_read(spec):
    pd, agg = spec.configuration("pd-nixl-tcp"), spec.configuration("aggregated")
    env = local_engine_env(spec, pd, "decode", nixl_port=5601, cpus="1", logging_config="/run/vllm-logging.json")
    assert env["UCX_TLS"] == LOCAL_UCX_TLS["tcp"] == "tcp"       # no shared memory between two local engines
    assert env["UCX_LOG_LEVEL"] == "info" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_LOGGING_CONFIG_PATH"] == "/run/vllm-logging.json" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    server = local_engine_env(spec, agg, "server", nixl_port=None)
    assert not any(k.startswith(("UCX_", "VLLM_NIXL_")) for k in server) and "CUDA_VISIBLE_DEVICES" not in server
    assert "VLLM_PORT" not in server
    assert local_engine_env(spec, agg, "server", nixl_port=None, internal_port=20_032)["VLLM_PORT"] == "20032"
    with pytest.raises(ValueError, match="pd-nixl-tcp prefill: NIXL needs a side-channel port"):
        local_engine_env(spec, pd, "prefill", nixl_port=None)


def test_on_a_gpu_host_each_replica_gets_its_own_gpus():
    data = load_spec("cpu-tiny").model_dump(mode="json")
    data["target"]["local"].update(device="cuda", tiny_model=False)
    data["configurations"][1]["roles"] = [{"role": "prefill", "replicas": 2}, {"role": "decode", "tp": 2}]
    data["hardware"]["gpus_per_node"] = 4
    spec = parse_spec(data)
    pd = spec.configuration("pd-nixl-tcp")
    assert local_gpus(pd) == {"prefill-0": [0], "prefill-1": [1], "decode-0": [2, 3]}
    env = local_engine_env(spec, pd, "decode", nixl_port=1, gpus=[2, 3])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["UCX_TLS"] == "tcp,cuda_copy"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


@pytest.mark.parametrize("cores, want", [
    ([0, 1], {"prefill-0": "0", "decode-0": "1"}),
    ([0, 1, 2, 3, 4], {"prefill-0": "0,1", "decode-0": "2,3,4"}),
    ([3], {"prefill-0": "3", "decode-0": "3"}),
    ([], {}),
])
def test_the_hosts_cores_are_split_among_the_engines(spec, cores, want):
    assert local_cpu_binds(spec.configuration("pd-nixl-tcp"), cores) == want
    assert local_cpu_binds(spec.configuration("aggregated"), [0, 1]) == {"server-0": "0,1"}


def test_vllms_logging_config_writes_lines_the_parsers_read():
    assert VLLM_LOGGING_CONFIG["formatters"]["vllm"]["format"] == VLLM_LOG_FORMAT
    record = logging.LogRecord("vllm.entrypoints.serve.utils.request_logger", logging.DEBUG, "request_logger.py", 74,
                               "Request %s JSON body: %s", ("epd-4-m1", '{"prompt": "x"}'), None)
    record.vllm_process_name, record.fileinfo = "APIServer", "request_logger.py"
    line = logging.Formatter(VLLM_LOG_FORMAT, VLLM_LOGGING_CONFIG["formatters"]["vllm"]["datefmt"]).format(record)
    parsed = parse_line(line)
    assert parsed.kind == "vllm" and parsed.severity == "DEBUG" and parsed.file == "request_logger.py"
    assert parsed.message == 'Request epd-4-m1 JSON body: {"prompt": "x"}'
    assert VLLM_LOGGING_CONFIG["loggers"]["vllm.entrypoints.serve.utils.request_logger"]["level"] == "DEBUG"
    assert VLLM_LOGGING_CONFIG["loggers"]["vllm"]["level"] == "INFO"
