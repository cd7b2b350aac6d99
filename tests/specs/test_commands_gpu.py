"""specs/commands.py on a GPU host (the gpu-qwen25vl preset): every engine's command line and environment and the
router's, per configuration, as `compare --target local` would start them — every engine on GPU 0 with its memory
share, NIXL and Mooncake held to TCP, EPD's encoder outputs through ECExampleConnector's shared folder, epdbench's
proxy in front (speaking MooncakeConnector's PD protocol for the Mooncake pair).
Golden file: tests/data/local-gpu/gpu-qwen25vl.json (regenerate after an intended change with UPDATE_GOLDEN=1)."""
import json
import os
from pathlib import Path

import pytest

from epdbench.specs.commands import (BUILTIN_ROUTER_MODULE, VLLM_SERVER_MODULE, builtin_router_args, ec_path,
                                     local_engine_args, local_engine_env, local_gpus, moves_kv)
from epdbench.specs.models import load_spec

GOLDEN = Path(__file__).parents[1] / "data" / "local-gpu" / "gpu-qwen25vl.json"
MODEL_DIR = "/results/run/real-shapes-model"
EC_DIR = "/dev/shm/epdbench-ec-RUN-epd"


def rendered(spec) -> dict:
    """Configuration -> replica -> command line and environment, and the router's command line, with ports
    numbered in start order from 8001 (NIXL side channels and Mooncake prefills' bootstrap servers from 5601), as the
    target hands them out."""
    out = {}
    for config in spec.configurations:
        gpus = local_gpus(config, spec.shares_one_gpu)
        port, side, engines, bootstraps, lines = 8000, 5600, [], {}, {}
        for role in config.roles:
            for i in range(role.replicas):
                name = f"{role.role}-{i}"
                port += 1
                nixl = boot = None
                if moves_kv(config, role.role) and (config.kv_connector == "nixl" or role.role == "prefill"):
                    side += 1
                    nixl, boot = (side, None) if config.kv_connector == "nixl" else (None, side)
                args = local_engine_args(spec, config, role, model=MODEL_DIR, port=port,
                                         ec_shared_dir=EC_DIR if config.topology == "epd" else None)
                env = local_engine_env(spec, config, role.role, nixl_port=nixl, gpus=gpus[name],
                                       logging_config="/results/run/vllm-logging.json", bootstrap_port=boot)
                lines[name] = {"command": ["PYTHON", "-m", VLLM_SERVER_MODULE, *args], "env": env}
                engines.append((role.role, f"http://127.0.0.1:{port}"))
                if boot:
                    bootstraps[engines[-1][1]] = boot
        kv_connector = None if config.topology == "aggregated" else config.kv_connector
        lines["router"] = {"command": ["python", "-m", BUILTIN_ROUTER_MODULE, *builtin_router_args(
            host="127.0.0.1", port=9000, engines=engines, kv_connector=kv_connector, bootstrap_ports=bootstraps)]}
        out[config.name] = lines
    return out


@pytest.fixture(scope="module")
def spec():
    return load_spec("gpu-qwen25vl")


@pytest.fixture(scope="module")
def lines(spec):
    return rendered(spec)


def test_rendered_command_lines_match_the_golden_file(lines):
    text = json.dumps(lines, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file {GOLDEN}: run with UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text()


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_every_engine_runs_on_gpu_0_with_its_share_and_random_weights_of_the_real_shapes(lines):
    shares = {}
    for config, procs in lines.items():
        for name, p in procs.items():
            if name == "router":
                continue
            assert p["env"]["CUDA_VISIBLE_DEVICES"] == "0"
            assert flag(p["command"], "--model") == MODEL_DIR and flag(p["command"], "--load-format") == "dummy"
            assert flag(p["command"], "--served-model-name") == "Qwen/Qwen2.5-VL-7B-Instruct"
            shares[f"{config}/{name}"] = float(flag(p["command"], "--gpu-memory-utilization"))
    assert shares == {"aggregated/server-0": 0.85, "pd-nixl-tcp/prefill-0": 0.45, "pd-nixl-tcp/decode-0": 0.45,
                      "pd-mooncake-tcp/prefill-0": 0.45, "pd-mooncake-tcp/decode-0": 0.45,
                      "epd/encode-0": 0.07, "epd/prefill-0": 0.41, "epd/decode-0": 0.41}


def test_kv_moves_over_nixl_held_to_tcp_with_gpu_buffers(lines):
    for config in ("pd-nixl-tcp", "epd"):
        for name, kv_role in (("prefill-0", "kv_producer"), ("decode-0", "kv_consumer")):
            p = lines[config][name]
            kv = json.loads(flag(p["command"], "--kv-transfer-config"))
            assert kv == {"kv_connector": "NixlConnector", "kv_role": kv_role,
                          "kv_connector_extra_config": {"backends": ["UCX"]}}     # kv_buffer_device: cuda, vLLM's
            assert p["env"]["UCX_TLS"] == "tcp,cuda_copy"        # no cuda_ipc, no shared memory: KV crosses TCP
            assert p["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert "--kv-transfer-config" not in lines["epd"]["encode-0"]["command"]
    assert not any(k.startswith("UCX_") for k in lines["epd"]["encode-0"]["env"])


def test_kv_moves_over_mooncake_forced_to_tcp_on_loopback_with_its_evidence_on(lines):
    pair = lines["pd-mooncake-tcp"]
    for name, kv_role in (("prefill-0", "kv_producer"), ("decode-0", "kv_consumer")):
        p = pair[name]
        assert json.loads(flag(p["command"], "--kv-transfer-config")) == {
            "kv_connector": "MooncakeConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
        mooncake = {k: v for k, v in p["env"].items() if k.startswith("MC_") or k in ("VLLM_HOST_IP",
                                                                                        "VLLM_LOG_STATS_INTERVAL")}
        assert mooncake == {"MC_FORCE_TCP": "1", "MC_TE_METRIC": "1", "MC_TE_METRIC_INTERVAL_SECONDS": "5",
                            "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOG_STATS_INTERVAL": "1"}
        assert not any(k.startswith(("UCX_", "VLLM_NIXL_")) for k in p["env"])
    assert pair["prefill-0"]["env"]["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "5601"
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in pair["decode-0"]["env"]      # only a producer starts the server
    assert pair["router"]["command"][-7:] == ["--kv-connector", "mooncake", "--prefill", "http://127.0.0.1:8001",
                                              "5601", "--decode", "http://127.0.0.1:8002"]


def test_each_mooncake_engines_ports_lie_in_its_own_block_and_a_prefill_needs_its_bootstrap_port(spec):
    config = spec.configuration("pd-mooncake-tcp")
    env = local_engine_env(spec, config, "decode", nixl_port=None, gpus=[0], internal_port=20_032)
    assert (env["VLLM_PORT"], env["MC_MIN_RPC_PORT"], env["MC_MAX_RPC_PORT"]) == ("20032", "20080", "20095")
    with pytest.raises(ValueError, match="^pd-mooncake-tcp prefill: MooncakeConnector needs a bootstrap port$"):
        local_engine_env(spec, config, "prefill", nixl_port=None, gpus=[0])
    with pytest.raises(ValueError, match="^prefill http://p: MooncakeConnector's PD protocol needs its bootstrap port$"):
        builtin_router_args(host="h", port=1, engines=[("prefill", "http://p")], kv_connector="mooncake")


def test_epds_encoder_outputs_go_through_one_shared_folder_by_mm_hash(spec, lines):
    encode, prefill = lines["epd"]["encode-0"]["command"], lines["epd"]["prefill-0"]["command"]
    assert json.loads(flag(encode, "--ec-transfer-config")) == {
        "ec_connector": "ECExampleConnector", "ec_role": "ec_producer",
        "ec_connector_extra_config": {"shared_storage_path": EC_DIR}}
    assert json.loads(flag(prefill, "--ec-transfer-config"))["ec_role"] == "ec_consumer"
    assert json.loads(flag(prefill, "--ec-transfer-config"))["ec_connector_extra_config"] == \
        {"shared_storage_path": EC_DIR}
    assert "--ec-transfer-config" not in lines["epd"]["decode-0"]["command"]
    assert {"--enforce-eager", "--no-enable-prefix-caching", "--mm-encoder-only"} <= set(encode)
    assert "--enforce-eager" not in prefill and "--mm-encoder-only" not in prefill
    assert ec_path(spec, spec.configuration("epd")) == "shm" and ec_path(spec, spec.configuration("aggregated")) == \
        "none"


def test_the_builtin_proxy_fronts_every_configuration_with_its_engines_by_role(lines):
    assert lines["epd"]["router"]["command"] == [
        "python", "-m", "epdbench.sim.proxy", "--host", "127.0.0.1", "--port", "9000",
        "--encode", "http://127.0.0.1:8001", "--prefill", "http://127.0.0.1:8002", "--decode", "http://127.0.0.1:8003"]
    assert lines["aggregated"]["router"]["command"][-2:] == ["--server", "http://127.0.0.1:8001"]


def test_epd_engines_need_the_encoder_output_folder(spec):
    config = spec.configuration("epd")
    with pytest.raises(ValueError, match="^epd encode: EPD on the local target needs the encoder-output folder$"):
        local_engine_args(spec, config, config.role("encode"), model=MODEL_DIR, port=1)


class NewLineFormatter026(__import__("logging").Formatter):
    """vLLM 0.26's formatter as it takes its arguments (vllm/logging_utils/formatter.py): fmt, datefmt, style only;
    the file's name as fileinfo."""

    def __init__(self, fmt, datefmt=None, style="%"):
        super().__init__(fmt, datefmt, style)

    def format(self, record):
        record.fileinfo = record.filename
        return super().format(record)


def test_vllm_026_gets_a_logging_config_it_can_load_and_whose_lines_the_parsers_read(monkeypatch, capsys):
    import logging
    import logging.config
    import types

    from epdbench.analysis.ec_files import ec_files_of_pod
    from epdbench.analysis.mooncake_log import transport_of_pod
    from epdbench.specs.commands import MOONCAKE_CONNECTOR_LOGGER, VLLM_LOGGING_CONFIG, vllm_logging_config

    module = types.ModuleType("vllm.logging_utils")
    module.NewLineFormatter = NewLineFormatter026
    parent = types.ModuleType("vllm")
    parent.logging_utils = module
    monkeypatch.setitem(__import__("sys").modules, "vllm", parent)
    monkeypatch.setitem(__import__("sys").modules, "vllm.logging_utils", module)
    with pytest.raises(ValueError, match="Unable to configure formatter 'vllm'"):
        logging.config.dictConfig(json.loads(json.dumps(VLLM_LOGGING_CONFIG)))     # 0.32's: log_level keyword
    assert vllm_logging_config("0.32.0+cpu") is VLLM_LOGGING_CONFIG is vllm_logging_config("unknown")
    try:
        logging.config.dictConfig(json.loads(json.dumps(vllm_logging_config("0.26.0"))))
        logger = logging.getLogger("vllm.distributed.ec_transfer.ec_connector.example_connector")
        record = logger.makeRecord(logger.name, logging.DEBUG, "/x/example_connector.py", 118,
                                   "Save cache successful for mm_hash %s", ("ab12",), None)
        logger.handle(record)
        logging.getLogger("vllm.distributed.kv_transfer").debug("not at DEBUG: left out")
        out = capsys.readouterr().out
        # 0.26 writes the process prefix on its decorated stdout (utils/system_utils.py decorate_logs)
        assert ec_files_of_pod([f"(EngineCore pid=7) {out}"])["saved"] == {"ab12"}
        assert "left out" not in out
        # MooncakeConnector's per-request send line (DEBUG) and an idle engine's KV Transfer metrics (the stat
        # logger's logger.debug, called in metrics.py:103) reach the log, and the transport parser reads them
        mooncake = logging.getLogger(MOONCAKE_CONNECTOR_LOGGER)
        mooncake.handle(mooncake.makeRecord(mooncake.name, logging.DEBUG, "/x/mooncake_connector.py", 1607,
                                            "Sending kv_caches for request %s (%d blocks) to %s",
                                            ("chatcmpl-r1-0a1b", 64, "127.0.0.1:20212"), None))
        stats = logging.getLogger("vllm.v1.metrics.loggers")
        stats.handle(stats.makeRecord(stats.name, logging.DEBUG, "/x/metrics.py", 103, "KV Transfer metrics: %s",
                                      ("Num successful transfers=1, Avg MB per transfer=56.0",), None))
        pod = transport_of_pod(f"(EngineCore pid=7) {line}" for line in capsys.readouterr().out.splitlines())
        assert (pod["requests_sent"], pod["successful_transfers"], pod["transfer_bytes"]) == (1, 1, 56 * 2 ** 20)
    finally:
        for name in VLLM_LOGGING_CONFIG["loggers"]:
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).setLevel(logging.NOTSET)
            logging.getLogger(name).propagate = True
