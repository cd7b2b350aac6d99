"""Every version the offline vLLM bundle for a Hopper GPU host carries, and what it leaves out and why: the one place
`epdbench engine-env --wheelhouse` reads them from, all written into the bundle's manifest.

The host (the device machines' 'cuda' image): Python 3.12.3 at /opt/torch/.venv/bin/python3 (itself a venv), torch
2.11.0+cu130 and the packages in IMAGE_PACKAGES, no network. The bundle carries vLLM trimmed of what a bf16 dense
model on Hopper never loads (VLLM_TRIMS), the rest of vLLM's Requires-Dist closure that the image lacks
(DEPENDENCY_PINS), and NIXL for CUDA 13. Reasons cite vLLM 0.26.0's own source, read in its wheel."""
from __future__ import annotations

VLLM_VERSION = "0.26.0"
VLLM_WHEEL = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
# vLLM 0.26.0 was released against NIXL 1.3.1, whose nixl-cu13 wheel carried the CUDA 12 build of UCX (its CUDA
# component does not load on CUDA 13; fixed in 1.3.2). 1.5.1 keeps the API the NixlConnector calls
# (nixl._api.nixl_agent, nixl_agent_config(backends=, num_threads=, capture_telemetry=),
# nixl._bindings.nixlXferTelemetry) and is the release this project's CPU lane runs.
NIXL_VERSION = "1.5.1"

TARGET_PYTHON = "3.12"          # cp312 wheels; the host has 3.12.3
TARGET_PYTHON_PATH = "/opt/torch/.venv/bin/python3"
# Ubuntu 24.04's Python 3.12.3: glibc 2.39. The newest tag a carried wheel needs is named in the manifest.
TARGET_PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)) + ("manylinux2014_x86_64",)
TARGET_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                  "os_name": "posix", "platform_machine": "x86_64", "platform_release": "", "platform_version": "",
                  "implementation_version": "3.12.3"}
PART_MIB = 60                   # the largest file the way to the host carries
DEFAULT_VENV = "~/.cache/epdbench/vllm-gpu"

# Files of vLLM's wheel left out (a prefix ending in / is a folder). Each reason names where vLLM 0.26.0 loads it.
VLLM_TRIMS = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so":
        "FlashAttention 2 (305 MB unpacked). vllm/vllm_flash_attn/flash_attn_interface.py imports it in try/except "
        "ImportError (FA2_AVAILABLE = False); vllm/v1/attention/backends/fa_utils.py get_flash_attn_version picks "
        "FA3 (_vllm_fa3_C, kept) on compute capability 9.x, for the language model and for the vision encoder "
        "(model_executor/layers/attention/mm_encoder_attention.py calls the same function). Only ALiBi models, "
        "VLLM_BATCH_INVARIANT with FA4 and an explicit flash_attn_version=2 ask for FA2 on Hopper",
    "vllm/_moe_C_stable_libtorch.abi3.so":
        "MoE kernels (topk_softmax, moe_align_block_size, grouped_topk, moe_sum, MoE Marlin/WNA16 GEMMs, "
        "moe_permute). vllm/platforms/cuda.py import_kernels() imports it under contextlib.suppress(ImportError); "
        "torch.ops._moe_C is called only by the MoE wrappers in vllm/_custom_ops.py (its one fake registration is "
        "behind hasattr(torch.ops, '_moe_C')) and layers/fused_moe/; a dense model such as Qwen2.5-VL-7B has no "
        "MoE layer",
    "vllm/vllm-rs":
        "the Rust API-server frontend binary, run only with VLLM_USE_RUST_FRONTEND=1 (vllm/envs.py "
        "_resolve_rust_frontend_path returns None when unset, the default); the Python OpenAI server serves "
        "otherwise",
    "vllm/third_party/deep_gemm/":
        "DeepGEMM (FP8 block-scaled and MoE grouped GEMMs, with the CUDA headers of its JIT). Found through "
        "vllm/utils/import_utils.py has_deep_gemm() (find_spec, then a trial import) and loaded by "
        "vllm/utils/deep_gemm.py _import_deep_gemm(), which returns None when it is absent; bf16 weights never "
        "reach it, and kernel warm-up skips it when is_deep_gemm_supported() is False",
    "vllm/third_party/fmha_sm100/":
        "Blackwell (SM100) sparse attention and CUTLASS headers for MiniMax-M3 only, imported inside functions of "
        "vllm/models/minimax_m3/nvidia/; never on Hopper",
}

# The same for NIXL: its expert-parallel all-to-all (nixl_ep, for MoE) ships builds for torch 2.12 to 2.14 only.
_NIXL_EP = ("NIXL's expert-parallel all-to-all for MoE models (nixl_ep), built for torch 2.12, 2.13 and 2.14 only: "
            "nixl_ep_cu13/__init__.py imports nixl_ep_cpp_torch211 under the host's torch 2.11, which is absent, so "
            "vLLM's has_nixl_ep() (vllm/utils/import_utils.py, a trial import) would print a traceback at every "
            "engine start and find it unusable; a dense model has no experts")
NIXL_TRIMS = {"nixl_ep/": _NIXL_EP}
NIXL_CU13_TRIMS = {"nixl_ep_cu13/": _NIXL_EP}
TRIMS = {"vllm": VLLM_TRIMS, "nixl": NIXL_TRIMS, "nixl-cu13": NIXL_CU13_TRIMS}

# vLLM's Requires-Dist left out: heavy optional kernel or codec packages that the Hopper bf16 dense path never
# imports at start-up (the import check after installing proves that part).
DROPPED = {
    "flashinfer-python":
        "FlashInfer kernels: imported by the FlashInfer attention backends (vllm/v1/attention/backends/"
        "flashinfer.py, mla/flashinfer_mla.py) and behind vllm/utils/flashinfer.py has_flashinfer() (find_spec); "
        "on Hopper the default backend is FLASH_ATTN (FA3); the sampler of vLLM's model runner imports it when "
        "it builds (vllm/v1/worker/gpu/sample/sampler.py via flashinfer_sampler_supported()) unless "
        "VLLM_USE_FLASHINFER_SAMPLER=0, which the environment sets (ENGINE_ENV): top-k/top-p then run in PyTorch",
    "tilelang":
        "TileLang kernels for mHC, imported inside functions of vllm/model_executor/kernels/mhc/ (DeepSeek-V4 "
        "family only)",
    "nvidia-cutlass-dsl":
        "the CuTe DSL (module cutlass): imported by vllm/cute_utils and the *_cutedsl kernels (MoE router, Mamba "
        "GDN, DSA indexer, DeepSeek-V4 and MiniMax-M3 ops) and by FA4 (vllm/vllm_flash_attn/cute); Hopper's "
        "attention for head sizes up to 256 is FA3, which needs none of them",
    "quack-kernels":
        "CuTe DSL helpers (module quack) for the same *_cutedsl kernels and FA4 only",
    "tokenspeed-mla":
        "MLA prefill kernels (DeepSeek-style MLA), imported inside functions of "
        "vllm/v1/attention/backends/mla/prefill/tokenspeed_mla.py",
    "humming-kernels":
        "quantized (MXFP4, NVFP4, mixed-precision) linear kernels, reached only through the lazy facade "
        "vllm/utils/humming.py after has_humming() (find_spec)",
    "pynvvideocodec":
        "NVDEC video decoding, imported inside a function of vllm/multimodal/video.py; images need none",
    "torchcodec":
        "video decoding: vllm/multimodal/video.py imports it in try/except (ImportError, RuntimeError) with a "
        "placeholder; images need none",
    "fastsafetensors":
        "the --load-format fastsafetensors loader: vllm/model_executor/model_loader/weight_utils.py imports it in "
        "try/except ImportError with a placeholder",
    "nvidia-cudnn-frontend":
        "module cudnn: imported only by FA4's benchmark helpers (vllm/vllm_flash_attn/cute/bench_utils.py, "
        "benchmark_flash_attention_fp8.py)",
    "nixl-cu12":
        "NIXL's CUDA 12 build, which the nixl meta package also lists: nixl/__init__.py loads the build matching "
        "torch's CUDA major (nixl_meta_utils.detect_cuda_major: 13 on the host), so nixl-cu13 serves",
}

# What the host's image holds: never carried (its own version is used). From the device machines' package list.
IMAGE_PACKAGES = (
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig",
    "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
    "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml",
    "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath",
    "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
    "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
    "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "opt-einsum", "opt-einsum-fx", "optax", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec",
    "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf",
    "psutil", "py-cpuinfo", "pyarrow", "pybind11", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentence-transformers", "sentencepiece", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torch-geometric", "torchaudio", "torchdiffeq", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
)
# The image's versions where they were read on a device machine (the rest are checked when install.sh runs).
IMAGE_VERSIONS = {
    "torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0",
    "tokenizers": "0.23.2", "numpy": "2.5.2", "safetensors": "0.8.0", "huggingface-hub": "1.33.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
}
IMAGE_NOTES = {
    "numba": "vLLM pins 0.65.0, which wants numpy < 2.5; the image's numpy is 2.5.2, so its numba is another "
             "release. vLLM imports numba only for n-gram speculative decoding (vllm/v1/spec_decode/"
             "ngram_proposer.py) and one model's processor",
}

# vLLM's Requires-Dist closure for the host less the image and DROPPED, resolved once for cp312 manylinux x86_64
# with the image's known versions and vLLM's own pins (xgrammar 0.2.7 is the newest that accepts vLLM's
# apache-tvm-ffi 0.1.10). `build` checks that each is required by something and nothing required is missing.
DEPENDENCY_PINS = {
    "agent-detector": "2.0.0", "annotated-types": "0.8.0", "anthropic": "2.17.0", "apache-tvm-ffi": "0.1.10",
    "astor": "0.8.1", "blake3": "1.0.11", "cachetools": "8.0.2", "cbor2": "6.3.0", "cffi": "2.1.1",
    "compressed-tensors": "0.17.0", "cryptography": "50.0.2", "depyf": "0.20.0", "detect-installer": "0.2.1",
    "dill": "0.4.1", "dnspython": "2.9.2", "docstring-parser": "0.18.0", "email-validator": "2.4.0",
    "fastapi": "0.136.3", "fastapi-cli": "0.0.34", "fastapi-cloud-cli": "0.28.0", "fastar": "0.12.0",
    "googleapis-common-protos": "1.76.0", "httpcore2": "2.17.0", "httptools": "0.9.0", "httpx2": "2.17.0",
    "ijson": "3.6.0", "interegular": "0.3.3", "jiter": "0.19.0", "jmespath": "1.1.0", "jsonschema": "4.26.0",
    "jsonschema-specifications": "2025.9.1", "lark": "1.2.2", "llguidance": "1.7.6", "lm-format-enforcer": "0.11.3",
    "loguru": "0.7.3", "mcp": "2.3.0", "mcp-types": "2.3.0", "mistral-common": "1.13.1",
    "model-hosting-container-standards": "0.1.16", "msgspec": "0.23.0", "nixl": NIXL_VERSION,
    "nixl-cu13": NIXL_VERSION, "nvtx": "0.2.15", "openai": "3.63.0", "openai-harmony": "0.0.8",
    "opentelemetry-api": "1.45.2", "opentelemetry-exporter-http-transport": "0.66b2",
    "opentelemetry-exporter-otlp": "1.45.2", "opentelemetry-exporter-otlp-common": "0.66b2",
    "opentelemetry-exporter-otlp-proto-common": "1.45.2", "opentelemetry-exporter-otlp-proto-grpc": "1.45.2",
    "opentelemetry-exporter-otlp-proto-http": "1.45.2", "opentelemetry-proto": "1.45.2",
    "opentelemetry-sdk": "1.45.2", "opentelemetry-semantic-conventions": "0.66b2",
    "opentelemetry-semantic-conventions-ai": "0.5.1", "outlines-core": "0.2.14",
    "partial-json-parser": "0.2.1.1.post7", "prometheus-fastapi-instrumentator": "8.1.0", "pybase64": "1.5.1",
    "pycountry": "26.2.16", "pycparser": "3.12", "pydantic": "2.14.4", "pydantic-core": "2.50.5",
    "pydantic-extra-types": "2.11.1", "pydantic-settings": "2.16.3", "pyjwt": "2.15.1", "python-dotenv": "1.2.4",
    "python-json-logger": "4.2.0", "python-multipart": "0.0.34", "pyzmq": "27.3.0", "referencing": "0.37.0",
    "rich-toolkit": "0.20.6", "rignore": "0.8.1", "rpds-py": "2026.9.1", "sentry-sdk": "2.76.0",
    "setproctitle": "1.3.8", "sniffio": "1.3.1", "sse-starlette": "3.7.1", "starlette": "1.10.0",
    "supervisor": "4.3.0", "truststore": "0.10.5", "typing-inspection": "0.4.5", "uvicorn": "0.55.0",
    "watchfiles": "1.3.0", "websockets": "17.4", "xgrammar": "0.2.7",
}

# Variables the environment sets for every interpreter it starts (install.sh writes them as os.environ defaults in a
# .pth, so `vllm serve`, `vllm bench` and epdbench's engines all get them; a value already in the environment wins):
# what makes vLLM run without a dropped package.
ENGINE_ENV = {
    # vLLM 0.26's sampler asks flashinfer_sampler_supported() when it is built; that imports the FlashInfer
    # attention backend (ModuleNotFoundError: flashinfer, measured on an H100) unless the switch is off.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}

# What install.sh imports once the environment is made (no GPU needed for any of them).
IMPORT_CHECK = ("vllm", "vllm.entrypoints.openai.api_server", "vllm.model_executor.models.qwen2_5_vl",
                "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector",
                "vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker",
                "vllm.distributed.ec_transfer.ec_connector.cpu.connector", "nixl._api")
