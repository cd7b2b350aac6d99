"""tasks/evidence.py's encoder-output verdict on the local target: the engines' ECExampleConnector lines and the
shared folder as it is when the configuration's evidence is collected (before the folder is removed)."""
from pathlib import Path

from epdbench.specs.models import load_spec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.evidence import ec_transport, filesystem_of, folder_listing

PER_IMAGE = 400 * 3584 * 2          # a 560-px image's encoder output on Qwen2.5-VL-7B (bf16)


def deployment(tmp_path: Path, ec_dir: Path, loaded: list[str]) -> Deployment:
    enc, pre = tmp_path / "encode-0.log", tmp_path / "prefill-0.log"
    enc.write_text("".join(f"(EngineCore pid=9) DEBUG 12-05 13:00:00 [example_connector.py:118] Save cache "
                           f"successful for mm_hash {h}\n" for h in ("h1", "h2")))
    pre.write_text("".join(f"(EngineCore pid=8) DEBUG 12-05 13:00:01 [example_connector.py:96] Success load encoder "
                           f"cache for hash {h}\n" for h in loaded))
    for h in ("h1", "h2"):
        (ec_dir / h).mkdir(parents=True)
        (ec_dir / h / "encoder_cache.safetensors").write_bytes(b"\0" * (PER_IMAGE + 128))
    return Deployment("epd", "", "", [Process("encode-0", "encode", "", enc), Process("prefill-0", "prefill", "", pre)],
                      ec_dir=ec_dir)


RECORDS = [{"phase": "measured", "image_hash": "i1", "image_px": 560},
           {"phase": "measured", "image_hash": "i2", "image_px": 560},
           {"phase": "warmup", "image_hash": "w1", "image_px": 560},
           {"phase": "measured", "image_hash": None, "image_px": None}]


def test_the_local_verdict_reads_the_lines_and_the_folder_and_names_its_filesystem(tmp_path):
    spec = load_spec("gpu-qwen25vl")
    ec = ec_transport(deployment(tmp_path, tmp_path / "ec", ["h1", "h2"]), spec, spec.configuration("epd"), RECORDS)
    assert (ec["images_expected"], ec["images_loaded"], ec["folder"]["files"]) == (2, 2, 2)
    assert ec["folder"]["bytes"] == 2 * (PER_IMAGE + 128)
    fs = filesystem_of(tmp_path)
    assert ec["folder"]["filesystem"] == fs
    if fs in ("tmpfs", "ramfs"):
        assert ec["verdict"] == "verified", ec["reasons"]
    else:                # a folder on disk is storage, not shared memory: never passed
        assert ec["verdict"] == "mismatch" and f"is on {fs}, not in memory" in ec["reasons"][0]


def test_a_missing_load_is_named_whatever_the_filesystem(tmp_path):
    spec = load_spec("gpu-qwen25vl")
    ec = ec_transport(deployment(tmp_path, tmp_path / "ec", ["h1"]), spec, spec.configuration("epd"), RECORDS)
    assert ec["verdict"] == "mismatch"
    assert ec["reasons"][0].startswith("prefill loaded 1 distinct images' encoder outputs for 2 distinct measured")


def test_dev_shm_is_memory_and_a_folder_gone_is_unread(tmp_path):
    if Path("/dev/shm").is_dir():
        assert filesystem_of(Path("/dev/shm")) in ("tmpfs", "ramfs")
    assert folder_listing(tmp_path / "gone") is None and folder_listing(None) is None


def test_through_dev_shm_the_handoff_is_verified(tmp_path):
    import os
    import shutil

    import pytest
    if not Path("/dev/shm").is_dir() or filesystem_of(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs /dev/shm on this host")
    folder = Path("/dev/shm") / f"epdbench-test-ec-{os.getpid()}"
    try:
        spec = load_spec("gpu-qwen25vl")
        ec = ec_transport(deployment(tmp_path, folder, ["h1", "h2", "h1"]), spec, spec.configuration("epd"), RECORDS)
        assert ec["verdict"] == "verified", ec["reasons"]
        assert ec["reasons"][0] == ("encode saved 2 images' encoder outputs, prefill loaded 2 of them (3 loads) for 2 "
                                    "distinct measured images")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
