"""README.md's commands are the ones that run: every `epdbench …` line of its code blocks and inline code is read
against the CLI's own argparse parser (epdbench.cli.parser.build_parser, and the simulator's for `epdbench sim`).
A synopsis line (with [optional] parts) may show only commands, flags, choices and presets the parser has, and
shows every flag of its command; a concrete command line must parse."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from epdbench.cli.common import CliError
from epdbench.cli.parser import build_parser
from epdbench.sim.server import build_parser as sim_parser
from epdbench.specs.models import PRESET_DIR

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`(epdbench [^`]+)`(?!`)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
CHOICES = re.compile(r"(--[a-z][a-z0-9-]*) ([\w.-]+(?:\|[\w.-]+)+)")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every sub-command's parser; `sim` is the simulator's own (the CLI hands it the rest of the line)."""
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {**action.choices, "sim": sim_parser()}


SUBS = subparsers()


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}


def code_commands(text: str) -> list[str]:
    """The `epdbench …` commands of the code blocks, a synopsis's continuation lines joined, comments dropped."""
    out: list[str] = []
    for block in FENCE.findall(text):
        going = False
        for line in block.splitlines():
            code = re.sub(r"(^|\s)#.*$", "", line).rstrip()
            if going and code[:1].isspace() and code.strip().startswith(("[", "--")):
                out[-1] += " " + code.strip()
                continue
            parts = [p.strip() for p in code.split("&&")]
            found = [p for p in parts if p.startswith("epdbench ")]
            out += found
            going = bool(found) and parts[-1] == found[-1]
    return out


def inline_commands(text: str) -> list[str]:
    return [" ".join(m.split()) for m in INLINE.findall(text)]


def is_synopsis(command: str) -> bool:
    return any(c in command for c in "[|") or "..." in command


SYNOPSIS = [c for c in code_commands(README) if is_synopsis(c)]
EXAMPLES = [c for c in code_commands(README) + inline_commands(README) if not is_synopsis(c)]


def test_the_readme_has_a_synopsis_and_examples_to_check():
    assert len(SYNOPSIS) >= len(SUBS) and EXAMPLES
    assert "epdbench compare" in EXAMPLES             # the quick start's command, after its install


def test_the_synopsis_shows_every_command_and_every_flag_of_each():
    shown = {c.split()[1] for c in SYNOPSIS}
    assert shown == set(SUBS), f"missing {set(SUBS) - shown}, unknown {shown - set(SUBS)}"
    for name, parser in SUBS.items():
        flags = {f for c in SYNOPSIS if c.split()[1] == name for f in FLAG.findall(c)}
        assert set(options(parser)) <= flags, f"{name}: the synopsis lacks {sorted(set(options(parser)) - flags)}"


@pytest.mark.parametrize("command", SYNOPSIS, ids=lambda c: " ".join(c.split()[:3]))
def test_each_synopsis_line_shows_only_what_the_parser_has(command):
    parser = SUBS[command.split()[1]]
    known = options(parser)
    unknown = [f for f in FLAG.findall(command) if f not in known]
    assert not unknown, f"not flags of {parser.prog}: {unknown}"
    for flag, alternatives in CHOICES.findall(command):
        shown = set(alternatives.split("|"))
        if flag == "--spec":             # the presets, and PATH for a spec file
            assert shown - {"PATH"} == {p.stem for p in PRESET_DIR.glob("*.yaml")}, shown
            continue
        assert known[flag].choices is not None and shown == set(known[flag].choices), (flag, shown)


@pytest.mark.parametrize("command", EXAMPLES, ids=lambda c: c[:60])
def test_each_command_the_readme_writes_out_parses(command):
    words = shlex.split(command)[1:]
    if len(words) == 1:                  # a command named in prose ("the `epdbench sync` command")
        assert words[0] in SUBS
        return
    parser = SUBS[words[0]] if words[0] == "sim" else build_parser()
    try:
        parser.parse_args(words[1:] if words[0] == "sim" else words)
    except CliError as e:
        pytest.fail(f"{command}: {e}")


def test_a_flag_the_parser_lacks_is_caught():
    """The check itself: a synopsis line with a made-up flag, a preset list missing one, a bad example."""
    with pytest.raises(AssertionError, match="--warp-drive"):
        test_each_synopsis_line_shows_only_what_the_parser_has("epdbench compare [--warp-drive N]")
    with pytest.raises(AssertionError):
        test_each_synopsis_line_shows_only_what_the_parser_has("epdbench compare [--spec smoke|PATH]")
    with pytest.raises(pytest.fail.Exception):
        test_each_command_the_readme_writes_out_parses("epdbench cleanup --runn r")
    assert code_commands("```\nepdbench plan [--spec S]   # what\n   [--json]\nepdbench sync R\n```\n") == [
        "epdbench plan [--spec S] [--json]", "epdbench sync R"]


DOCUMENTED = README + (ROOT / "docs" / "reports.md").read_text()


def documented_keys(prefix: str) -> list[str]:
    """The MLflow key patterns README and docs/reports.md write in code spans, e.g. `wins.<metric>.<config>`."""
    return sorted({m for m in re.findall(r"`([^`\s]+)`", DOCUMENTED) if m.startswith(prefix)})


def as_regex(pattern: str) -> re.Pattern:
    """`a.<x>[.<y>].b` or `a.*` as a regex: <x> one dotless segment, [.<y>] an optional one, * the rest."""
    r = re.escape(pattern)
    r = re.sub(r"\\\[\\\.<\w+>\\\]", r"(?:\\.[^.]+)?", r)
    r = re.sub(r"<\w+>", r"[^.]+", r).replace(r"\*", r".+")
    return re.compile(r)


def the_keys_of_a_mixed_and_a_fixed_cell(tmp_path) -> dict[str, list[str]]:
    """The keys the comparison run gets: verdict tags, win counts, goodput metrics (tasks.publishing)."""
    from epdbench.analysis.compare import VERDICT_METRICS, Comparison
    from epdbench.reports.mlflow_view import verdict_tags, verdict_wins
    from epdbench.tasks.publishing.publish import goodput_metrics

    cells = [Comparison("mixed", "2048-4096/32", 2, "burst", VERDICT_METRICS[0], {}, "pd-tcp", "epd", 1.5, "pd-tcp"),
             Comparison("fixed", "512/64", 8, "main", VERDICT_METRICS[0], {}, None, None, None, "tie")]
    (tmp_path / "goodput.csv").write_text("config,suite,shape,goodput_req_s,goodput_req_s_per_gpu\n"
                                          "epd,capacity,1260px+400/128,4.0,0.5\n")
    logged: dict = {}
    tracker = type("Tracker", (), {"log_metrics": lambda self, run, metrics: logged.update(metrics)})()
    goodput_metrics(tracker, "parent", tmp_path / "goodput.csv")
    counts = verdict_wins(cells, ["pd-tcp", "epd"])
    return {"epdbench.verdict.": list(verdict_tags(cells)),
            **{prefix: [k for k in counts if k.startswith(prefix)] for prefix in ("wins.", "ties.", "contaminated.")},
            "goodput_req_s.": [k for k in logged if k.startswith("goodput_req_s.")]}


def test_the_mlflow_names_the_docs_show_are_the_ones_published(tmp_path):
    keys = the_keys_of_a_mixed_and_a_fixed_cell(tmp_path)
    assert any(k.endswith(".c2.burst.ttft_p50_ms") for k in keys["epdbench.verdict."])   # a mixed stream's segment
    for prefix, published in keys.items():
        patterns = documented_keys(prefix)
        assert patterns and published, prefix
        for pattern in patterns:                       # each name shown fits what is published...
            assert any(as_regex(pattern).fullmatch(k) for k in published), (pattern, published)
        for key in published:                          # ...and each name published is shown
            assert any(as_regex(p).fullmatch(key) for p in patterns), (key, patterns)
    verdict = [as_regex(p) for p in documented_keys("epdbench.verdict.")]
    assert all(all(r.fullmatch(k) for k in keys["epdbench.verdict."]) for r in verdict)   # main and burst alike
