"""tasks/local/wheelhouse.py: what the offline GPU bundle leaves out, carries and checks, as pure functions; and
the pins of epdbench's environment against the environment this repository's tests run in."""
import csv
import importlib.metadata as md
import io

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import (Wheel, WheelhouseError, build_manifest, closure, environment,
                                             from_image_checks, needed_glibc, outside_needed, part_name, part_ranges,
                                             pick_wheels, requires_dist, rewrite_record, trim_needed_problems,
                                             trim_plan, trimmed_summary, wheel_identity, wheel_rows)

ENTRIES = ["vllm/__init__.py", "vllm/_C.abi3.so", "vllm/big.so", "vllm/third_party/kern/a.py",
           "vllm/third_party/kern/include/b.hpp", "vllm/third_party/kept.py", "vllm-1.0.dist-info/METADATA",
           "vllm-1.0.dist-info/RECORD"]
TRIMS = {"vllm/big.so": "never loaded here", "vllm/third_party/kern/": "another chip's"}
MARKERS = pins.TARGET_MARKERS


def test_a_trim_takes_one_file_or_a_whole_folder_and_nothing_else():
    assert trim_plan(ENTRIES, TRIMS) == {"vllm/big.so": "never loaded here",
                                         "vllm/third_party/kern/a.py": "another chip's",
                                         "vllm/third_party/kern/include/b.hpp": "another chip's"}


def test_a_trim_that_matches_nothing_is_refused_as_pins_for_another_release():
    with pytest.raises(WheelhouseError,
                       match=r"the vllm wheel has no vllm/gone\.so: the trims .* are for another vllm release"):
        trim_plan(ENTRIES, {**TRIMS, "vllm/gone.so": "moved"})


def test_a_trim_never_reaches_the_dist_info():
    with pytest.raises(WheelhouseError, match="dist-info"):
        trim_plan(ENTRIES, {"vllm-1.0.dist-info/": "no"})


def test_the_record_loses_exactly_the_removed_rows_and_keeps_the_others_byte_for_byte():
    record = ("vllm/__init__.py,sha256=AAA,10\nvllm/big.so,sha256=BBB,99\n"
              '"vllm/a,b.py",sha256=CCC,3\nvllm-1.0.dist-info/RECORD,,\n')
    out = rewrite_record(record, {"vllm/big.so"})
    assert list(csv.reader(io.StringIO(out))) == [["vllm/__init__.py", "sha256=AAA", "10"],
                                                  ["vllm/a,b.py", "sha256=CCC", "3"],
                                                  ["vllm-1.0.dist-info/RECORD", "", ""]]


def test_the_manifest_rows_of_the_trims_count_files_and_unpacked_bytes():
    removed = trim_plan(ENTRIES, TRIMS)
    sizes = {"vllm/big.so": 1000, "vllm/third_party/kern/a.py": 5, "vllm/third_party/kern/include/b.hpp": 7}
    assert trimmed_summary(removed, sizes, TRIMS) == [
        {"path": "vllm/big.so", "files": 1, "bytes": 1000, "reason": "never loaded here"},
        {"path": "vllm/third_party/kern/", "files": 2, "bytes": 12, "reason": "another chip's"}]


def test_requires_dist_reads_metadata_headers():
    meta = "Metadata-Version: 2.4\nName: x\nRequires-Dist: a>=1\nRequires-Dist: b; extra == \"c\"\n\nbody"
    assert requires_dist(meta) == ("a>=1", 'b; extra == "c"')


def test_wheel_names_give_canonical_names_and_the_glibc_they_need():
    assert wheel_identity("Foo_Bar-1.2-py3-none-any.whl") == ("foo-bar", "1.2")
    with pytest.raises(WheelhouseError, match="not a wheel file name"):
        wheel_identity("foo.tar.gz")
    assert needed_glibc(["a-1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                         "b-1-cp39-abi3-manylinux_2_31_x86_64.whl", "c-1-py3-none-any.whl"]) == "2.31"
    assert needed_glibc(["c-1-py3-none-any.whl"]) == "any"


WHEELS = {
    "vllm": Wheel("vllm.whl", "vllm", "1.0", ("dep-a>=2", "torch==2.11.0", "heavy-kernels",
                                              "fastapi[standard]<1", 'win-only; sys_platform == "win32"',
                                              'bench-only; extra == "bench"')),
    "dep-a": Wheel("dep_a.whl", "dep-a", "2.1", ("numpy<2.4",)),
    "fastapi": Wheel("fastapi.whl", "fastapi", "0.9", ('uvicorn; extra == "standard"', "starlette")),
    "uvicorn": Wheel("uvicorn.whl", "uvicorn", "0.5", ()),
    "starlette": Wheel("starlette.whl", "starlette", "1.0", ()),
    "nixl": Wheel("nixl.whl", "nixl", "1.5.1", ("nixl-cu12==1.5.1", "nixl-cu13==1.5.1")),
    "nixl-cu13": Wheel("nixl_cu13.whl", "nixl-cu13", "1.5.1", ("torch",)),
}
IMAGE = {"torch", "numpy"}
DROPPED = {"heavy-kernels": "never imported on this path", "nixl-cu12": "the host is CUDA 13"}


def walk(wheels=WHEELS, dropped=DROPPED):
    return closure(["vllm", "nixl"], wheels, IMAGE, {"numpy": "2.5.2", "torch": "2.11.0"}, dropped, MARKERS)


def test_the_closure_follows_extras_and_markers_and_sorts_each_requirement():
    found = walk()
    assert found.problems() == []
    assert set(found.carried) == {"vllm", "dep-a", "fastapi", "uvicorn", "starlette", "nixl", "nixl-cu13"}
    assert found.carried["uvicorn"] == ["fastapi 0.9"]         # reached through fastapi[standard] only
    assert found.dropped == {"heavy-kernels": ["vllm 1.0"], "nixl-cu12": ["nixl 1.5.1"]}
    assert found.from_image["torch"] == [{"by": "vllm 1.0", "spec": "==2.11.0"}, {"by": "nixl-cu13 1.5.1", "spec": ""}]


def test_an_image_version_outside_a_requirement_is_a_known_conflict_not_a_problem():
    found = walk()
    assert found.unsatisfied == [{"name": "numpy", "spec": "<2.4", "have": "2.5.2", "by": "dep-a 2.1",
                                  "where": "image"}]
    assert found.problems() == []


def test_what_nothing_carries_or_needs_is_a_problem_each_named():
    wheels = {k: v for k, v in WHEELS.items() if k != "starlette"}
    wheels["stray"] = Wheel("stray.whl", "stray", "1", ())
    wheels["dep-a"] = Wheel("dep_a.whl", "dep-a", "1.9", ())
    found = walk(wheels, {**DROPPED, "old-drop": "gone"})
    assert found.problems() == [
        "starlette (required by fastapi 0.9) is neither carried, in the image, nor dropped with a reason",
        "dep-a 1.9 is carried but vllm 1.0 requires dep-a>=2",
        "stray is carried but nothing requires it",
        "old-drop is dropped with a reason but nothing requires it"]


def test_a_requirement_reached_again_with_more_extras_is_counted_once():
    wheels = {**WHEELS, "vllm": Wheel("vllm.whl", "vllm", "1.0", ("fastapi", "fastapi[standard]", "dep-a>=2",
                                                                  "torch", "heavy-kernels"))}
    found = walk(wheels)
    assert found.carried["starlette"] == ["fastapi 0.9"] and found.carried["uvicorn"] == ["fastapi 0.9"]


def test_pick_wheels_finds_each_pin_once_and_names_the_lacking():
    files = ["a-1.0-py3-none-any.whl", "b-2.0-cp312-cp312-manylinux_2_28_x86_64.whl",
             "b-2.0-cp312-cp312-manylinux_2_17_x86_64.whl", "b-1.0-py3-none-any.whl", "notes.txt"]
    assert pick_wheels(files, {"a": "1.0", "b": "2.0"}) == {"a": "a-1.0-py3-none-any.whl",
                                                           "b": "b-2.0-cp312-cp312-manylinux_2_17_x86_64.whl"}
    with pytest.raises(WheelhouseError, match=r"no wheel for c==3 among the downloads"):
        pick_wheels(files, {"a": "1.0", "c": "3"})


def test_parts_cover_the_tar_exactly_with_a_short_last_one():
    assert part_ranges(250, 100) == [(0, 100), (100, 100), (200, 50)]
    assert part_ranges(200, 100) == [(0, 100), (100, 100)]
    assert part_ranges(0, 100) == [(0, 0)]
    with pytest.raises(WheelhouseError):
        part_ranges(10, 0)
    assert [part_name("b", i) for i in (0, 11)] == ["b.tar.001", "b.tar.012"]


def test_an_environment_says_why_each_drop_and_what_the_image_must_meet():
    found = walk()
    checks = from_image_checks(found, {"numpy": "see the docs"}, {"numpy": "2.5.2"})
    env = environment(found, roots=["vllm", "nixl"], default_venv="~/v", dropped=DROPPED, image_checks=checks,
                      import_check=("vllm",), engine_env={"X_SWITCH": "0"}, commands=[("vllm", "--help")])
    assert env["dropped"]["nixl-cu12"] == {"reason": "the host is CUDA 13", "required_by": ["nixl 1.5.1"]}
    assert {"name": "numpy", "spec": "<2.4", "by": "dep-a 2.1", "known_version": "2.5.2",
            "note": "see the docs"} in env["from_image"]
    assert env["known_conflicts"] == found.unsatisfied and env["import_check"] == ["vllm"]
    assert env["engine_env"] == {"X_SWITCH": "0"} and env["commands"] == [["vllm", "--help"]]
    m = build_manifest(stem="s", pins={}, target={}, wheels=[], trimmed={}, environments={"vllm": env},
                       system_libs={}, tar={"sha256": "t"}, parts=[])
    assert m["format"] == 2 and m["environments"]["vllm"] is env


def test_a_wheel_both_environments_take_at_one_version_is_one_row_and_another_version_its_own():
    vllm_side = walk()
    epd_wheels = {"epdbench": Wheel("epdbench.whl", "epdbench", "0.1", ("starlette", "fastapi==1.5", "dep-a",
                                                                       'tok; extra == "local"')),
                  "starlette": WHEELS["starlette"], "fastapi": Wheel("fastapi15.whl", "fastapi", "1.5", ()),
                  "dep-a": WHEELS["dep-a"], "tok": Wheel("tok.whl", "tok", "3", ())}
    epd_side = closure(["epdbench"], epd_wheels, IMAGE, {}, {}, MARKERS, {"epdbench": ("local",)})
    assert epd_side.problems() == [] and epd_side.carried["tok"] == ["epdbench 0.1"]   # through the local extra
    files = [{"file": w.file, "name": n, "version": w.version} for n, w in {**WHEELS, **epd_wheels}.items()]
    files.append({"file": "fastapi.whl", "name": "fastapi", "version": "0.9"})
    env_files = {"vllm": {n: w.file for n, w in WHEELS.items()}, "epdbench": {n: w.file for n, w in epd_wheels.items()}}
    rows = {r["file"]: r for r in wheel_rows(files, env_files, {"vllm": vllm_side, "epdbench": epd_side})}
    assert rows["starlette.whl"]["envs"] == ["vllm", "epdbench"]
    assert rows["fastapi.whl"]["envs"] == ["vllm"] and rows["fastapi15.whl"]["envs"] == ["epdbench"]
    assert rows["dep_a.whl"]["required_by"] == ["epdbench 0.1", "vllm 1.0"]


def test_a_trim_may_not_remove_a_library_a_kept_file_needs_and_what_is_needed_outside_is_named():
    kept = {"mooncake/engine.so": ["libasio.so", "libibverbs.so.1", "libcudart.so.13", "libc.so.6"],
            "mooncake/libasio.so": ["libibverbs.so.1", "libstdc++.so.6"]}
    assert trim_needed_problems(kept, ["mooncake/_store.so", "x.libs/libzmq.so.5"]) == []
    assert trim_needed_problems(kept, ["mooncake/libasio.so"]) == [
        "mooncake/engine.so NEEDS libasio.so, which a trim removes (mooncake/libasio.so)"]
    assert outside_needed(kept, {"libc.so.6", "libstdc++.so.6", "libcudart.so.13"}) == ["libibverbs.so.1"]


def test_epdbench_pins_close_its_requirements_as_installed_here_with_nothing_missing_or_unused():
    """The pins are the versions this repository's tests run with: its environment's metadata walked for the host,
    at the pinned versions. epdbench's own pins (pyproject.toml) are installed exactly; a dependency of theirs that a
    fresh install took at a newer release than its pin (a fresh CI machine got pydocket 0.28.0 beside the pinned
    0.27.2) is walked with the installed release's requirements, the pinned version checked against its range."""
    installed = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions()}
    names = ["epdbench", *pins.EPDBENCH_DEPENDENCY_PINS]
    pinned = {"epdbench": installed["epdbench"].version, **pins.EPDBENCH_DEPENDENCY_PINS}
    wheels = {n: Wheel(n, n, pinned[n], tuple(installed[n].requires or ())) for n in names}
    found = closure(["epdbench"], wheels, set(pins.IMAGE_PACKAGES), pins.IMAGE_VERSIONS, pins.EPDBENCH_DROPPED,
                    pins.TARGET_MARKERS, {"epdbench": pins.EPDBENCH_EXTRAS})
    assert found.problems() == []
    direct = {canonicalize_name(Requirement(r).name) for r in installed["epdbench"].requires or ()
              if "==" in r} & set(pins.EPDBENCH_DEPENDENCY_PINS)
    assert direct and all(installed[n].version == pins.EPDBENCH_DEPENDENCY_PINS[n] for n in direct)
    assert found.dropped == {"vllm-router": [f"epdbench {installed['epdbench'].version}"]}
    assert {u["name"] for u in found.unsatisfied} <= {"numpy", "tokenizers"}    # the image's newer releases


def test_the_pins_keep_one_version_each_and_carry_nothing_the_image_has():
    image = set(pins.IMAGE_PACKAGES)
    assert not image & set(pins.DEPENDENCY_PINS) and not image & set(pins.DROPPED)
    assert not set(pins.DROPPED) & set(pins.DEPENDENCY_PINS)
    assert {"torch", "torchvision", "torchaudio", "triton"} <= image
    assert pins.DEPENDENCY_PINS["nixl"] == pins.DEPENDENCY_PINS["nixl-cu13"] == pins.NIXL_VERSION
    assert all(reason.strip() for reason in [*pins.DROPPED.values(),
                                             *(r for trims in pins.TRIMS.values() for r in trims.values())])
    assert set(pins.TRIMS) <= {"vllm", *pins.DEPENDENCY_PINS}
    epd = set(pins.EPDBENCH_DEPENDENCY_PINS)
    assert not image & epd and not epd & set(pins.EPDBENCH_DROPPED) and not image & set(pins.EPDBENCH_DROPPED)
    assert all(reason.strip() for reason in [*pins.EPDBENCH_DROPPED.values(), *pins.MOONCAKE_TRIMS.values()])
    assert pins.DEPENDENCY_PINS["mooncake-transfer-engine-cuda13"] == pins.MOONCAKE_VERSION
    assert pins.IMPORT_CHECK.index("torch") < pins.IMPORT_CHECK.index("mooncake.engine")
    # a part and the checkout's ~6 MB of tracked files travel in one call of at most 64 MiB
    assert pins.PART_MIB * 2**20 + 6 * 10**6 < 64 * 2**20
