"""Did EPD's encoder outputs cross from Encode to Prefill through a shared folder (pure: lines and a folder's
listing in, a verdict out)?

On one host the local target hands encoder outputs over with vLLM's ECExampleConnector: the encode engine writes
each image's output to `<folder>/<mm_hash>/encoder_cache.safetensors` and logs it, the prefill engine finds the
file by the same mm_hash (vLLM hashes the image with the model's name, so both engines name it alike), loads it
instead of encoding and logs that (ec_connector/example_connector.py, DEBUG, which the local target's logging
config enables):

    (EngineCore pid=9) DEBUG 12-05 13:00:00 [example_connector.py:118] Save cache successful for mm_hash 3f2a…
    (EngineCore pid=7) DEBUG 12-05 13:00:01 [example_connector.py:96] Success load encoder cache for hash 3f2a…

`verified` needs every hash a prefill pod loaded saved by an encode pod, as many distinct loads as the run had
distinct measured images (a prefill that encoded an image itself logs no load), the folder in memory (tmpfs: the
handoff stays in shared memory) and holding at least the measured images' encoder outputs. What moved is never
claimed to have crossed a network: the expected transport is `shm`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from epdbench.analysis.logformats import parse_line

SAVED = re.compile(r"Save cache successful for mm_hash (\S+)$")
LOADED = re.compile(r"Success load encoder cache for hash (\S+)$")
CONNECTOR_FILE = "example_connector.py"
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def ec_files_of_pod(lines: Iterable[str]) -> dict:
    """The mm_hashes one pod saved and loaded, from ECExampleConnector's own lines."""
    saved: set[str] = set()
    loaded: list[str] = []
    emulated = False
    for raw in lines:
        line = parse_line(raw)
        if line is None or line.kind != "vllm" or line.file != CONNECTOR_FILE:
            continue
        emulated |= line.emulated
        if m := SAVED.match(line.message):
            saved.add(m.group(1))
        elif m := LOADED.match(line.message):
            loaded.append(m.group(1))
    return {"saved": saved, "loaded": loaded, "emulated": emulated}


def verify_ec_files(pods: dict[str, dict], roles: dict[str, str], expected: dict, folder: dict | None) -> dict:
    """pods: name -> ec_files_of_pod; roles: name -> encode | prefill; expected: `images` (distinct measured
    images) and `bytes` (their encoder outputs); folder: `path`, `filesystem`, `files`, `bytes` (None: unread)."""
    saved = set().union(*(p["saved"] for n, p in pods.items() if roles.get(n) == "encode"))
    loads = [h for n, p in pods.items() if roles.get(n) == "prefill" for h in p["loaded"]]
    loaded = set(loads)
    view = {n: {"saved": len(p["saved"]), "loaded": len(p["loaded"]), "role": roles.get(n)} for n, p in pods.items()}
    base = {"expected": "shm", "what": "ec", "connector": "ECExampleConnector", "pods": view, "folder": folder,
            "images_expected": expected.get("images"), "images_loaded": len(loaded), "images_saved": len(saved)}
    if any(p["emulated"] for p in pods.values()):
        return {**base, "verdict": "emulated", "reasons": ["the encoder-output lines are the simulator's"]}
    if not saved and not loaded:
        return {**base, "verdict": "no-evidence",
                "reasons": ["no ECExampleConnector save or load line in the encode and prefill logs (its lines are "
                            "DEBUG: the engines' logging config must enable vllm.distributed.ec_transfer)"]}
    problems, reasons = [], []
    if unsaved := loaded - saved:
        problems.append(f"prefill loaded {len(unsaved)} encoder output(s) no encode pod logged saving")
    if expected.get("images") and len(loaded) < expected["images"]:
        problems.append(f"prefill loaded {len(loaded)} distinct images' encoder outputs for "
                        f"{expected['images']} distinct measured images: the rest were encoded on the prefill "
                        "engine itself (or never reached it)")
    if folder is None:
        problems.append("the encoder-output folder could not be read")
    else:
        if folder["filesystem"] not in MEMORY_FILESYSTEMS:
            problems.append(f"the encoder-output folder {folder['path']} is on {folder['filesystem']}, not in "
                            "memory: the handoff went through storage, not shared memory")
        if expected.get("bytes") and folder["bytes"] < expected["bytes"]:
            problems.append(f"the folder holds {folder['bytes'] / 1e6:.1f} MB, less than the measured images' "
                            f"encoder outputs ({expected['bytes'] / 1e6:.1f} MB)")
    if problems:
        return {**base, "verdict": "mismatch", "reasons": problems}
    reasons.append(f"encode saved {len(saved)} images' encoder outputs, prefill loaded {len(loaded)} of them "
                   f"({len(loads)} loads) for {expected.get('images')} distinct measured images")
    reasons.append(f"through {folder['path']} on {folder['filesystem']} ({folder['files']} files, "
                   f"{folder['bytes'] / 1e6:.1f} MB): shared memory on this host, no network")
    return {**base, "verdict": "verified", "reasons": reasons}
