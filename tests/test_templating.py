"""The one Jinja environment of reports and manifests: strict, autoescaped only for HTML, with toyaml."""
from __future__ import annotations

import jinja2
import pytest

from epdbench.templating import make_env


def test_make_env_is_strict(tmp_path):
    env = make_env(tmp_path)
    assert env.from_string("{{ present }}").render(present="x") == "x"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ meta.missing }}").render(meta={})


def test_autoescape_only_for_html(tmp_path):
    assert make_env(tmp_path).from_string("{{ x }}").render(x="<b>") == "<b>"
    assert make_env(tmp_path, html=True).from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"


def test_toyaml_filter_and_caller_filters(tmp_path):
    env = make_env(tmp_path, filters={"shout": str.upper})
    assert env.from_string("{{ v | toyaml }}").render(v={"a": [1, 2]}) == "a:\n- 1\n- 2"
    assert env.from_string("{{ 'kv' | shout }}").render() == "KV"


def test_templates_load_from_the_given_folder(tmp_path):
    (tmp_path / "t.j2").write_text("{% if x %}\n  {{ x }}\n{% endif %}\n")
    assert make_env(tmp_path).get_template("t.j2").render(x="y") == "  y\n"
