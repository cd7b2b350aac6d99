"""Workload suites: fixed shapes, multimodal cells, mixed multi-stream windows and open-loop rate sweeps."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from epdbench.specs.base import Strict

Concurrency = Annotated[int, Field(ge=1, le=4096)]     # closed-loop workers of a cell


class Shape(Strict):
    input_tokens: int = Field(ge=1, title="Input tokens",
                              description="Target prompt length in tokens (text tokens when an image is sent).")
    output_tokens: int = Field(ge=1, title="Output tokens", description="Requested output tokens (max_tokens).")
    image_px: int | None = Field(None, ge=28, le=4096, title="Image edge (px)",
                                 description="Send one square image per request (chat API), a fresh one each "
                                             "request; none: text only (completions API).")

    @property
    def workload(self) -> str:
        return (f"{self.image_px}px+" if self.image_px else "") + f"{self.input_tokens}/{self.output_tokens}"


class CellCounts(Strict):
    n_warmup: int = Field(2, ge=0, le=1000, title="Warm-up requests per cell",
                          description="Sent first and excluded from statistics.")
    n_measured: int = Field(8, ge=1, le=100000, title="Measured requests per cell",
                            description="Default number of measured requests of a cell.")
    n_measured_by_concurrency: dict[Concurrency, Annotated[int, Field(ge=1, le=100000)]] = Field(
        default_factory=dict, title="Measured requests by concurrency",
        description="Overrides n_measured for the given concurrencies, e.g. {16: 64}.")
    n_warmup_by_concurrency: dict[Concurrency, Annotated[int, Field(ge=0, le=1000)]] = Field(
        default_factory=dict, title="Warm-up requests by concurrency",
        description="Overrides n_warmup for the given concurrencies, e.g. {32: 32}: a full batch at the cell's "
                    "concurrency before measuring, so a real engine's first step of that size (kernels built "
                    "for a new shape) is not measured.")

    first_wave_spread_s: float = Field(
        0.1, ge=0, le=60, title="First-wave spread (s)",
        description="Closed loop: the first request of each worker is sent at a seeded random instant within "
                    "this long after the cell starts, so the workers' prefills do not all land in the same "
                    "engine steps (in lockstep, TTFT p50 flips between two modes from run to run). 0: all at once.")

    def measured_for(self, concurrency: int) -> int:
        return self.n_measured_by_concurrency.get(concurrency, self.n_measured)

    def warmup_for(self, concurrency: int) -> int:
        return self.n_warmup_by_concurrency.get(concurrency, self.n_warmup)

    def load_text(self) -> str:
        """How the suite offers its load, in words (the report says it per suite)."""
        spread = (f", each worker's first request sent at a seeded random instant within "
                  f"{self.first_wave_spread_s:g} s" if self.first_wave_spread_s > 0 else ", all workers starting at once")
        return f"closed loop: each worker sends its next request when the last ends{spread}"


class FixedSuite(CellCounts):
    kind: Literal["fixed"] = Field("fixed", title="Kind",
                                   description="Fixed shapes (text, or text and an image) at fixed concurrency.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. fixed.")
    shapes: list[Shape] = Field(min_length=1, title="Shapes", description="input/output token shapes.")
    concurrencies: list[Concurrency] = Field(min_length=1, title="Concurrencies",
                                             description="Closed-loop worker counts (1–4096); each shape runs at each.")


class ImageCell(Strict):
    name: str = Field(title="Cell name", description="e.g. 1k.")
    image_px: int = Field(ge=28, le=4096, title="Image edge (px)", description="Square image edge length.")
    text_tokens: int = Field(ge=1, title="Text tokens", description="Target text tokens besides the image.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="max_tokens of each request.")

    @property
    def workload(self) -> str:
        return f"{self.name}:{self.image_px}px+{self.text_tokens}/{self.output_tokens}"


class MultimodalSuite(CellCounts):
    kind: Literal["multimodal"] = Field("multimodal", title="Kind",
                                        description="One image plus text per request, chat API.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. mm-context.")
    cells: list[ImageCell] = Field(min_length=1, title="Cells", description="Image size and text per cell.")
    concurrencies: list[Concurrency] = Field(min_length=1, title="Concurrencies",
                                             description="Closed-loop worker counts (1–4096).")
    reuse_image: bool = Field(False, title="Reuse one image",
                              description="Send the same image with every request (encoder-cache reuse).")
    image_format: Literal["png", "jpeg"] = Field("png", title="Image format",
                                                 description="Encoding of the synthetic images in the data URL.")


class Slo(Strict):
    """Service-level objective of a rate suite: per-request bounds and the share of requests that must meet
    them all (DistServe's attainment; 0.9 makes each bound a p90, 0.99 a p99)."""
    ttft_ms: float | None = Field(None, gt=0, title="TTFT bound (ms)",
                                  description="Time from the request's scheduled arrival to its first token.")
    tpot_ms: float | None = Field(None, gt=0, title="TPOT bound (ms)",
                                  description="(last token − first token) / (output tokens − 1) of the request.")
    itl_ms: float | None = Field(None, gt=0, title="ITL bound (ms)",
                                 description="Largest gap between two consecutive tokens of the request.")
    itl_p99_ms: float | None = Field(None, gt=0, title="ITL p99 bound (ms)",
                                     description="p99 of every gap between consecutive tokens of the rate's "
                                                 "measured requests, pooled (the summary's ITL p99): a rate "
                                                 "whose ITL p99 exceeds it is not sustained, whatever its "
                                                 "attainment.")
    attainment: float = Field(0.9, gt=0, le=1, title="Attainment target",
                              description="Share of measured requests (failed ones included, as misses) that "
                                          "must meet every bound for a rate to count as sustained.")

    @model_validator(mode="after")
    def _some_bound(self) -> "Slo":
        if self.ttft_ms is None and self.tpot_ms is None and self.itl_ms is None and self.itl_p99_ms is None:
            raise ValueError("slo: give at least one of ttft_ms, tpot_ms, itl_ms, itl_p99_ms")
        return self


class RateSuite(Strict):
    kind: Literal["rate"] = Field("rate", title="Kind",
                                  description="Open-loop arrivals at offered request rates (a sweep per shape).")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. capacity.")
    shapes: list[Shape] = Field(min_length=1, title="Shapes", description="input/output token shapes.")
    rates: list[float] = Field(min_length=1, title="Request rates (req/s)",
                               description="Offered rates of the sweep; each shape runs at each.")
    arrival: Literal["poisson", "constant"] = Field(
        "poisson", title="Arrival process",
        description="poisson: seeded exponential gaps at the rate; constant: one request every 1/rate s.")
    n_warmup: int = Field(2, ge=0, le=1000, title="Warm-up requests per cell",
                          description="Sent together, and awaited, before the arrivals start.")
    n_measured: int = Field(64, ge=1, le=1000000, title="Measured requests per rate",
                            description="Arrivals per cell; the cell lasts about n_measured / rate seconds.")
    max_in_flight: int = Field(1024, ge=1, le=65536, title="Most requests in flight",
                               description="The client's cap; an arrival finding it reached waits, and that wait "
                                           "counts in its TTFT (from scheduled arrival) and in the send lag.")
    slo: Slo | None = Field(None, title="SLO", description="Bounds for goodput: the highest rate sustained.")

    def load_text(self) -> str:
        process = "Poisson arrivals (seeded)" if self.arrival == "poisson" else "one arrival every 1/rate s"
        return (f"open loop: {process} at {', '.join(f'{r:g}' for r in self.rates)} req/s, at most "
                f"{self.max_in_flight} in flight (an arrival finding them all busy waits, and its wait counts)")

    @model_validator(mode="after")
    def _rates(self) -> "RateSuite":
        if any(not 0 < r <= 100000 for r in self.rates):
            raise ValueError(f"rates must be in (0, 100000] req/s: {self.rates}")
        if sorted(set(self.rates)) != self.rates:
            raise ValueError(f"rates must be increasing and distinct: {self.rates}")
        return self


class StreamSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Stream name", description="e.g. steady, burst.")
    input_tokens: int | None = Field(None, ge=1, title="Input tokens",
                                     description="Fixed prompt length (text tokens when an image is sent).")
    input_tokens_min: int | None = Field(None, ge=1, title="Input tokens (min)",
                                         description="With input_tokens_max: lengths drawn uniformly from the seed.")
    input_tokens_max: int | None = Field(None, ge=1, title="Input tokens (max)",
                                         description="Upper bound of the seeded uniform prompt length.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="max_tokens of each request.")
    n_requests: int = Field(ge=1, le=100000, title="Requests", description="Measured requests of this stream.")
    concurrency: int = Field(ge=1, le=4096, title="Concurrency", description="Workers of this stream.")
    arrival: Literal["closed", "burst"] = Field(
        "closed", title="Arrival pattern",
        description="closed: each worker sends as soon as its last request ends; burst: groups of burst_size "
                    "requests released every burst_interval_s (still at most `concurrency` in flight).")
    burst_size: int = Field(4, ge=1, title="Burst size", description="Requests released together (burst arrival).")
    burst_interval_s: float = Field(2.0, ge=0, le=3600, title="Burst interval (s)",
                                    description="Time between the starts of two bursts.")
    image_px: int | None = Field(None, ge=28, le=4096, title="Image edge (px)",
                                 description="Send one square image per request (chat API); none: text only.")

    @model_validator(mode="after")
    def _lengths(self) -> "StreamSpec":
        ranged = self.input_tokens_min is not None or self.input_tokens_max is not None
        if ranged == (self.input_tokens is not None):
            raise ValueError(f"stream {self.name}: give input_tokens, or input_tokens_min and input_tokens_max")
        if ranged and (self.input_tokens_min is None or self.input_tokens_max is None
                       or self.input_tokens_min > self.input_tokens_max):
            raise ValueError(f"stream {self.name}: input_tokens_min must be <= input_tokens_max, both set")
        return self

    @property
    def workload(self) -> str:
        tokens = (f"{self.input_tokens}" if self.input_tokens is not None
                  else f"{self.input_tokens_min}-{self.input_tokens_max}")
        return (f"{self.image_px}px+" if self.image_px else "") + f"{tokens}/{self.output_tokens}"


class MixedSuite(Strict):
    kind: Literal["mixed"] = Field("mixed", title="Kind",
                                   description="Streams running at the same time; throughput over the whole window.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. mixed.")
    streams: list[StreamSpec] = Field(min_length=1, title="Streams", description="Concurrent request streams.")
    n_warmup: int = Field(0, ge=0, le=1000, title="Warm-up requests per stream",
                          description="Sent (closed loop) before the window opens; excluded from statistics.")

    def load_text(self) -> str:
        parts = [f"{st.name}: " + (f"closed loop at concurrency {st.concurrency}" if st.arrival == "closed" else
                                   f"bursts of {st.burst_size} every {st.burst_interval_s:g} s, at most "
                                   f"{st.concurrency} in flight") for st in self.streams]
        return "streams at once — " + "; ".join(parts)

    @model_validator(mode="after")
    def _unique(self) -> "MixedSuite":
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise ValueError(f"stream names must be unique: {names}")
        return self


Suite = Annotated[Union[FixedSuite, MultimodalSuite, MixedSuite, RateSuite], Field(discriminator="kind")]


def sends_images(suite: FixedSuite | MultimodalSuite | MixedSuite | RateSuite) -> bool:
    """Whether some request of the suite carries an image: a multimodal suite, or a shape or stream with image_px."""
    if isinstance(suite, MultimodalSuite):
        return True
    return any(part.image_px for part in (suite.streams if isinstance(suite, MixedSuite) else suite.shapes))
