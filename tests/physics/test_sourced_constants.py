"""The RDMA defaults are what their source gives: the fit of benchmarks/transport/mooncake_rdma_published.py to the
transfer times Mooncake published (a default edited by hand, or the table, would part from it)."""

import pytest

from epdbench.specs.models import load_spec
from epdbench.specs.node import HardwareSpec
from tests.benchmark_scripts import load_benchmark


def published_fit() -> dict:
    module = load_benchmark("transport/mooncake_rdma_published")
    return module.fit(module.TABLE)


def test_rdma_defaults_are_the_fit_to_mooncakes_published_transfers():
    fit = published_fit()
    assert fit["lo_ms"] < fit["latency_ms"] < fit["hi_ms"]
    defaults = HardwareSpec.model_fields
    assert defaults["rdma_latency_ms"].default == pytest.approx(fit["latency_ms"], abs=0.005)
    assert defaults["rdma_efficiency"].default == pytest.approx(fit["efficiency"], abs=0.005)
    assert fit["worst_rel"] < 0.08                        # one line fits every row within 8 %


@pytest.mark.parametrize("preset", ["smoke", "pd-text", "epd-multimodal", "epd-reuse", "pd-nixl"])
def test_presets_use_the_sourced_rdma_figures(preset):
    hw = load_spec(preset).hardware
    defaults = HardwareSpec.model_fields
    assert (hw.rdma_latency_ms, hw.rdma_efficiency) == (defaults["rdma_latency_ms"].default,
                                                        defaults["rdma_efficiency"].default)
