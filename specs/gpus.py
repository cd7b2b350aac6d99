"""GPUs whose datasheet figures epdbench knows, by the name a device reports (torch.cuda.get_device_name,
nvidia-smi): a table measured on one of them puts the spec's node on its figures (pure).

Each figure is the datasheet's, named per GPU below; dense BF16 is half the datasheet's "with sparsity" figure.
"""
from __future__ import annotations

from dataclasses import dataclass

from epdbench.specs.models import ExperimentSpec


@dataclass(frozen=True)
class Datasheet:
    gpu: str                # hardware.gpu
    bf16_tflops: float      # dense BF16 tensor TFLOP/s
    hbm_tb_s: float
    hbm_gb: float
    nvlink_gb_s: float      # both directions together
    source: str


DATASHEETS = {d.gpu: d for d in (
    Datasheet("H100-SXM5-80GB", 989, 3.35, 80, 900,
              "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 1,979 TFLOPS with sparsity, 80 GB "
              "HBM3 at 3.35 TB/s, NVLink 900 GB/s"),
    Datasheet("H200-SXM-141GB", 989, 4.8, 141, 900,
              "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: BF16 1,979 TFLOPS with sparsity (the "
              "H100 SXM's compute), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s"),
)}
# What the devices call themselves (the CUDA device name; an H100 PCIe or NVL, an H200 NVL, report other names).
DEVICE_NAMES = {"NVIDIA H100 80GB HBM3": "H100-SXM5-80GB", "NVIDIA H200": "H200-SXM-141GB"}


def datasheet_for(device: str) -> Datasheet | None:
    """The datasheet of a device by the name it reports, or by hardware.gpu; None when unknown."""
    name = str(device).strip()
    return DATASHEETS.get(DEVICE_NAMES.get(name, name))


def known_devices() -> str:
    """The device names datasheet_for knows, in words."""
    return ", ".join(f"{name!r} ({gpu})" for name, gpu in DEVICE_NAMES.items())


def on_gpu(spec: ExperimentSpec, sheet: Datasheet) -> ExperimentSpec:
    """`spec` with its node's datasheet figures those of `sheet` (the free constants kept); itself when the node
    already is that GPU."""
    if spec.hardware.gpu == sheet.gpu:
        return spec
    figures = {"gpu": sheet.gpu, "bf16_tflops": sheet.bf16_tflops, "hbm_tb_s": sheet.hbm_tb_s,
               "hbm_gb": sheet.hbm_gb, "nvlink_gb_s": sheet.nvlink_gb_s}
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update=figures)})
