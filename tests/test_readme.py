"""README.md is documentation a newcomer can trust: short, no lab log, links that resolve, a headline the run supports.

The results block between ``spade_lib.report.RESULTS_BEGIN`` / ``RESULTS_END`` is generated
(``python -m spade_lib.report readme RUN_DIR``); everything outside it is hand-written and checked here:
at most 200 lines, no commit hash, no table cell over 300 characters (README, ``docs/``, DEVELOPERS.md, data/README.md), every
document it links or names (``docs/*.md``, ``DEVELOPERS.md``, ``data/README.md``) exists, and the headline's claim
(a drafted model slower than autoregressive decoding at T = 0 and T = 1, prompt lookup the fastest
configuration at both and faster than autoregressive decoding beyond its interval at T = 0) holds in the generated block's table. A regenerated block that contradicts the
headline fails here, so the prose is rewritten with the run. The README's Python example is run by
``tests/test_front_door.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spade_lib import report

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
DEVELOPERS = [REPO / "DEVELOPERS.md", REPO / "data" / "README.md"]


def parts() -> tuple[str, str, str]:
    """(before the results block, the block, after it)."""
    text = README.read_text()
    assert text.count(report.RESULTS_BEGIN) == 1 and text.count(report.RESULTS_END) == 1
    head, rest = text.split(report.RESULTS_BEGIN)
    block, tail = rest.split(report.RESULTS_END)
    return head, block, tail


def hand_written() -> str:
    head, _, tail = parts()
    return head + tail


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def test_no_commit_hash_outside_the_generated_block():
    words = re.findall(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])", hand_written())
    assert [w for w in words if re.search(r"\d", w) and re.search(r"[a-f]", w)] == []


@pytest.mark.parametrize("path", [README, *DOCS, *DEVELOPERS], ids=lambda p: str(p.relative_to(REPO)))
def test_table_cells_are_readable(path):
    long = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("|"):
            long += [(i, len(c)) for c in line.strip().strip("|").split(" | ") if len(c) > 300]
    assert long == [], f"{path.name}: cells over 300 characters at (line, length) {long}"


def linked_paths(text: str) -> set[str]:
    links = {m for m in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in m}
    named = set(re.findall(r"`((?:[\w-]+/)?[A-Z][\w-]*\.md|docs/[\w.-]+\.md)`", text))  # not run outputs (summary.md)
    return links | named


@pytest.mark.parametrize("path", [README, *DOCS, DEVELOPERS[0]], ids=lambda p: str(p.relative_to(REPO)))
def test_named_documents_exist(path):
    text = hand_written() if path == README else path.read_text()
    missing = [p for p in sorted(linked_paths(text)) if not (path.parent / p).exists() and not (REPO / p).exists()]
    assert missing == []


def test_readme_links_the_docs():
    text = hand_written()
    assert "DEVELOPERS.md" in text and DOCS
    assert all(f"docs/{d.name}" in text for d in DOCS)


def speedups(block: str) -> dict[tuple[str, str], tuple[float, float, float]]:
    """``{(configuration, temperature): (point, low, high)}`` from the block's table, by its header's
    ``speedup T=...`` columns."""
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("|")]
    assert lines, "no table in the results block"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    columns = {i: m.group(1) for i, c in enumerate(header) if (m := re.fullmatch(r"speedup T=(\S+)", c))}
    assert columns, f"no 'speedup T=...' column in the header {header}"
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for i, t in columns.items():
            m = re.fullmatch(r"([\d.]+)× \[([\d.]+), ([\d.]+)\]", cells[i])
            if m:
                out[(cells[0].strip("`"), t)] = tuple(float(x) for x in m.groups())
    return out


def test_the_headline_holds_in_the_results_block():
    """The README's headline pair is the results block's, and what the head says of it holds there: the 0.5B draft
    of Qwen2.5-Coder-1.5B is timed at T = 0 and T = 1 beside the null-draft control, which is below 1x."""
    head, block, _ = parts()
    flat = " ".join(head.split())
    assert "Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct" in flat
    assert "qwen2.5-coder" in block.lower()
    table = speedups(block)
    for t in ("0", "1"):
        row = {name: v for (name, col), v in table.items() if col == t}
        assert row, f"no speedups at T = {t} in the results block"
        assert any(n.startswith("spade-coder-0.5b") for n in row), f"T = {t}: no row of the 0.5B draft in {sorted(row)}"
        nulls = {n: v for n, v in row.items() if n.startswith("spade-null")}
        assert nulls and all(v[0] < 1.0 for v in nulls.values()), f"T = {t}: the null-draft control {nulls}"
    # what the head says of the two drafts is the block's: the figures it quotes, each beyond 1x by its interval
    int8 = [table[("spade-coder-0.5b-fr32k-int8-g4", t)] for t in ("0", "1")]
    assert (f"running **{int8[0][0]:.2f}x faster than autoregressive decoding at T = 0 and {int8[1][0]:.2f}x at "
            "T = 1**") in flat and all(v[1] > 1.0 for v in int8), int8
    fp32 = [table[("spade-coder-0.5b-fr32k-g4", t)] for t in ("0", "1")]
    assert f"(the fp32 draft: {fp32[0][0]:.2f}x and {fp32[1][0]:.2f}x)" in flat and all(v[1] > 1.0 for v in fp32)
    coder0 = table[("spade-coder-0.5b-fr32k-g4", "0")]
    hf_assisted = [v for (n, col), v in table.items() if col == "0" and n.startswith("hf_assisted-coder")]
    assert hf_assisted and all(v[0] < coder0[0] for v in hf_assisted)



def test_the_parser_reads_a_table_row():
    block = ("| configuration | alpha T=0 | speedup T=0 | alpha T=1 | speedup T=1 |\n| --- | --- | --- | --- | --- |\n"
             "| `hf` | – | – | – | 0.43× [0.40, 0.46] |\n"
             "| `spade-ngram-g4` | 0.59 [0.53, 0.65] | 1.39× [1.22, 1.61] | 0.35 [0.28, 0.41] | 1.10× [1.02, 1.20] |\n")
    assert speedups(block) == {("hf", "1"): (0.43, 0.40, 0.46), ("spade-ngram-g4", "0"): (1.39, 1.22, 1.61),
                               ("spade-ngram-g4", "1"): (1.10, 1.02, 1.20)}
