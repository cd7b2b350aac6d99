"""The Dockerfile (no Docker here, so a static check of what the images are made of): every package folder is
copied, the base is pinned, the final stages run as a non-root user without build tools, and the router image
bakes in the same vllm-router the package and the spec's default pin."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from epdbench.specs.targets import KubeRouterSpec

ROOT = Path(__file__).resolve().parents[1]


def stages() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        m = re.match(r"^FROM\s+\S+\s+AS\s+(\w+)", line)
        if m:
            current = m.group(1)
            out[current] = []
        elif current and line.strip() and not line.startswith("#"):
            out[current].append(line)
    return out


def test_the_build_stage_copies_every_package_folder_of_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {m.group(1) for line in stages()["build"] for m in [re.match(r"^COPY (\w+)/ \1/$", line)] if m}
    assert folders <= copied, folders - copied


def test_base_is_pinned_and_final_stages_are_non_root_without_build_tools():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+$", text, re.M)
    assert ":latest" not in text
    s = stages()
    for name in ("runner", "router"):
        users = [line.split()[1] for line in s[name] if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), name
        assert not any(re.search(r"apt-get install|gcc|build-essential", line) for line in s[name]), name
    assert any(line.startswith("COPY --from=build /opt/epdbench") for line in s["runner"])


def test_router_image_bakes_in_the_pinned_vllm_router():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("vllm-router=="))
    router = "\n".join(stages()["router"])
    assert f'"{pin}"' in router
    assert KubeRouterSpec().pip_install == pin
