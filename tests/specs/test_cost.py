"""specs/cost.py: the price of a GPU-hour in the spec and on `compare`'s command line — validated, overridable, and
outside what makes two runs comparable (a price changes no figure a run measures)."""
from __future__ import annotations

import pytest

from epdbench.cli import main
from epdbench.specs.models import PRESET_DIR, SpecError, load_spec, parse_spec, spec_changes, spec_fingerprint

# Every preset's fingerprint before the field existed (gpu-qwen25vl's and vllm-truth's since their cells and
# configurations of 2026-12-07, gpu-qwen25vl's since its simulator clock became virtual, 2026-12-08; smoke's since it became the quick start in virtual time with three trials, 2026-12-07:
# with `trials: 1` on the real clock it is c28140e494a4b680 as before): nightly history matches runs on them.
FINGERPRINTS = {"cpu-tiny": "fb97ebc3ca05a1bf", "epd-multimodal": "44ce3323c6919ff2", "epd-reuse": "787a60ccd008bccc",
                "gpu-qwen25vl": "cec00e7d4cfcc68f", "pd-nixl": "318915711abad75c", "pd-text": "00a2cca05024945e",
                "smoke": "c698607e1e4e2248", "vllm-truth": "12b0764030acc0d2"}


def test_smoke_on_the_real_clock_with_one_trial_keeps_the_fingerprint_it_had_before_the_quick_start_changed():
    data = load_spec("smoke").model_dump(mode="json")
    data["trials"] = 1
    data["target"]["sim"]["clock"] = "real"
    assert spec_fingerprint(parse_spec(data)) == "c28140e494a4b680"


def priced(spec, usd):
    return parse_spec({**spec.model_dump(mode="json"), "cost": {"gpu_hour_usd": usd}})


def test_no_preset_sets_a_price_and_every_fingerprint_is_the_one_before_the_field():
    assert sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) == sorted(FINGERPRINTS)
    for name, fingerprint in FINGERPRINTS.items():
        spec = load_spec(name)
        assert spec.cost.gpu_hour_usd is None
        assert spec_fingerprint(spec) == fingerprint, name


def test_a_price_changes_neither_the_fingerprint_nor_what_a_resume_compares():
    spec = load_spec("smoke")
    with_price = priced(spec, 2.5)
    assert with_price.cost.gpu_hour_usd == 2.5
    assert spec_fingerprint(with_price) == FINGERPRINTS["smoke"]
    assert spec_changes(spec, with_price) == []


@pytest.mark.parametrize("usd, why", [(-0.01, "greater than or equal to 0"), ("nan", "finite number"),
                                      ("inf", "finite number"), ("two", "valid number")])
def test_a_bad_price_is_one_line_naming_the_field(usd, why):
    with pytest.raises(SpecError) as exc:
        priced(load_spec("smoke"), usd)
    msg = str(exc.value)
    assert msg.startswith("spec: field 'cost.gpu_hour_usd': ") and why in msg and "\n" not in msg


def test_a_free_gpu_is_a_price():
    assert priced(load_spec("smoke"), 0).cost.gpu_hour_usd == 0.0


def test_the_flag_overrides_the_specs_price(started_with, tmp_path, tiny_spec):
    path = tmp_path / "priced.yaml"
    path.write_text(priced(tiny_spec, 4.0).model_dump_json())
    assert started_with("--spec", str(path), "--clock", "virtual").cost.gpu_hour_usd == 4.0
    assert started_with("--spec", str(path), "--clock", "virtual", "--gpu-hour-usd", "1.25").cost.gpu_hour_usd == 1.25
    assert started_with("--clock", "virtual").cost.gpu_hour_usd is None


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_flag_is_refused_in_one_line(value, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--clock", "virtual", "--gpu-hour-usd", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --gpu-hour-usd {float(value):g}: give the price of one GPU-hour in USD")
    assert len(err.splitlines()) == 1 and not (tmp_path / "results").exists()
