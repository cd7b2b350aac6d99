"""The project's one Jinja environment factory, shared by the report and the Kubernetes manifests (pure):
StrictUndefined, trimmed blocks, a `toyaml` filter, autoescape only for HTML."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import jinja2
import yaml


def make_env(template_dir: Path, html: bool = False,
             filters: Mapping[str, Callable] | None = None) -> jinja2.Environment:
    """A strict environment over `template_dir`; `filters` adds the caller's own filters."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=html)
    env.filters["toyaml"] = lambda v: yaml.safe_dump(v, sort_keys=False).rstrip()
    env.filters.update(filters or {})
    return env
