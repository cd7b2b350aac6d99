"""Workload suites: fixed shapes, multimodal cells and mixed multi-stream windows."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from epdbench.specs.base import Strict


class Shape(Strict):
    input_tokens: int = Field(ge=1, title="Input tokens", description="Target prompt length in tokens.")
    output_tokens: int = Field(ge=1, title="Output tokens", description="Requested output tokens (max_tokens).")

    @property
    def workload(self) -> str:
        return f"{self.input_tokens}/{self.output_tokens}"


class CellCounts(Strict):
    n_warmup: int = Field(2, ge=0, le=1000, title="Warm-up requests per cell",
                          description="Sent first and excluded from statistics.")
    n_measured: int = Field(8, ge=1, le=100000, title="Measured requests per cell",
                            description="Default number of measured requests of a cell.")
    n_measured_by_concurrency: dict[int, int] = Field(
        default_factory=dict, title="Measured requests by concurrency",
        description="Overrides n_measured for the given concurrencies, e.g. {16: 64}.")

    def measured_for(self, concurrency: int) -> int:
        return self.n_measured_by_concurrency.get(concurrency, self.n_measured)


class FixedSuite(CellCounts):
    kind: Literal["fixed"] = Field("fixed", title="Kind", description="Fixed text shapes at fixed concurrency.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Suite name", description="e.g. fixed.")
    shapes: list[Shape] = Field(min_length=1, title="Shapes", description="input/output token shapes.")
    concurrencies: list[int] = Field(min_length=1, title="Concurrencies",
                                     description="Closed-loop worker counts; each shape runs at each.")


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
    concurrencies: list[int] = Field(min_length=1, title="Concurrencies", description="Closed-loop worker counts.")
    reuse_image: bool = Field(False, title="Reuse one image",
                              description="Send the same image with every request (encoder-cache reuse).")
    image_format: Literal["png", "jpeg"] = Field("png", title="Image format",
                                                 description="Encoding of the synthetic images in the data URL.")


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

    @model_validator(mode="after")
    def _unique(self) -> "MixedSuite":
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise ValueError(f"stream names must be unique: {names}")
        return self


Suite = Annotated[Union[FixedSuite, MultimodalSuite, MixedSuite], Field(discriminator="kind")]
