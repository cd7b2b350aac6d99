"""analysis/ec_files.py: EPD's encoder outputs through vLLM's ECExampleConnector on one host, read from the encode
and prefill engines' own lines (vLLM 0.26 example_connector.py, DEBUG) and the shared folder they went through."""
from epdbench.analysis.ec_files import ec_files_of_pod, verify_ec_files

ENC = "(EngineCore pid=411) DEBUG 12-05 13:00:0{i} [example_connector.py:118] Save cache successful for mm_hash {h}"
PRE = "(EngineCore pid=522) DEBUG 12-05 13:00:0{i} [example_connector.py:96] Success load encoder cache for hash {h}"
ROLES = {"encode-0": "encode", "prefill-0": "prefill"}
SHM = {"path": "/dev/shm/epdbench-ec-x-epd", "filesystem": "tmpfs", "files": 3, "bytes": 3 * 2_867_200 + 300}
EXPECTED = {"images": 3, "bytes": 3 * 2_867_200}


def pods(saved, loaded, extra=()) -> dict:
    enc = [ENC.format(i=i, h=h) for i, h in enumerate(saved)]
    pre = [PRE.format(i=i, h=h) for i, h in enumerate(loaded)] + list(extra)
    return {"encode-0": ec_files_of_pod(enc), "prefill-0": ec_files_of_pod(pre)}


def test_every_image_saved_by_encode_and_loaded_by_prefill_through_memory_is_verified():
    out = verify_ec_files(pods(["a1", "b2", "c3"], ["a1", "b2", "c3"]), ROLES, EXPECTED, SHM)
    assert out["verdict"] == "verified", out["reasons"]
    assert (out["expected"], out["images_loaded"], out["images_saved"]) == ("shm", 3, 3)
    assert out["reasons"][1] == ("through /dev/shm/epdbench-ec-x-epd on tmpfs (3 files, 8.6 MB): shared memory on "
                                 "this host, no network")


def test_an_image_the_prefill_encoded_itself_is_a_mismatch():
    out = verify_ec_files(pods(["a1", "b2", "c3"], ["a1", "b2"]), ROLES, EXPECTED, SHM)
    assert out["verdict"] == "mismatch"
    assert out["reasons"] == ["prefill loaded 2 distinct images' encoder outputs for 3 distinct measured images: the "
                              "rest were encoded on the prefill engine itself (or never reached it)"]


def test_a_load_no_encode_pod_saved_and_a_folder_on_disk_are_named():
    disk = {**SHM, "filesystem": "ext4", "path": "/tmp/ec"}
    out = verify_ec_files(pods(["a1", "b2"], ["a1", "b2", "zz"]), ROLES, EXPECTED, disk)
    assert out["verdict"] == "mismatch"
    assert out["reasons"][0] == "prefill loaded 1 encoder output(s) no encode pod logged saving"
    assert "the encoder-output folder /tmp/ec is on ext4, not in memory" in out["reasons"][1]


def test_a_folder_holding_less_than_the_images_outputs_is_a_mismatch():
    out = verify_ec_files(pods(["a1", "b2", "c3"], ["a1", "b2", "c3"]), ROLES, EXPECTED, {**SHM, "bytes": 1000})
    assert out["verdict"] == "mismatch" and "holds 0.0 MB, less than" in out["reasons"][0]


def test_no_connector_line_is_no_evidence_and_lines_elsewhere_never_count():
    quoted = ["(APIServer pid=1) INFO 12-05 13:00:00 [request_logger.py:64] Received request chatcmpl-x: params: "
              "Save cache successful for mm_hash a1",
              "(EngineCore pid=522) DEBUG 12-05 13:00:00 [gpu_model_runner.py:3167] Finish execute for mm hash a1"]
    out = verify_ec_files(pods([], [], quoted), ROLES, EXPECTED, SHM)
    assert out["verdict"] == "no-evidence" and "vllm.distributed.ec_transfer" in out["reasons"][0]
    assert ec_files_of_pod(quoted) == {"saved": set(), "loaded": [], "emulated": False}


def test_an_unread_folder_is_a_mismatch():
    out = verify_ec_files(pods(["a1"], ["a1"]), ROLES, {"images": 1, "bytes": 10}, None)
    assert out["verdict"] == "mismatch" and out["reasons"] == ["the encoder-output folder could not be read"]
