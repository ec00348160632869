"""The embedded offline source: prompts cut from the corpus documents the embedded models never saw.

:func:`spade_lib.zoo.corpus.build_corpus` holds out whole files of the pinned ``transformers`` wheel:
some as code, others as the prose paragraphs of their docstrings (never both).
This module cuts each held-out document into (prompt, continuation) pairs in four categories whose
predictability differs — which is the point: acceptance ``alpha`` depends on the task.

- ``code_completion``  a function's signature and docstring -> its body (a HumanEval-shaped task).
- ``docstring``        the first part of a docstring or ``#`` comment block -> the rest (prose about code).
- ``reference_prose``  the first part of a docstring prose paragraph of a held-out prose document
                       (a file whose code the models never saw either) -> the rest (technical English).
- ``structured``       the first lines of a long literal (dict / list / tuple), a run of constant
                       assignments, a bulleted / numbered list, or a grammar block -> the following
                       lines (highly regular text).

Every candidate is a row ``{"category", "subtask", "turns": [prompt], "reference": [continuation],
"source": "embedded", "source_id": "<document>:<line>"}``; the order is deterministic (documents in
corpus order, then position in the document). Prose prompts are cut at a sentence boundary near the
middle of their text (``cut_fraction``), code prompts at line boundaries.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

from spade_lib.zoo.corpus import docstring_of, parse

CATEGORIES = ("code_completion", "docstring", "reference_prose", "structured")
SOURCE_NAME = "embedded"
LICENSE = "Apache-2.0 (transformers 5.24.0 source files and docstrings, the pinned wheel in requirements.txt)"


@dataclass(frozen=True)
class EmbeddedConfig:
    min_chars: int = 60          # shortest prompt kept
    max_chars: int = 1600        # longest prompt kept (longer ones are skipped, not truncated)
    max_reference_chars: int = 1200  # continuation kept as ``reference`` (truncated at a line end)
    min_prose_words: int = 20    # docstrings / comment blocks shorter than this are skipped
    min_paragraph_words: int = 16  # prose-document paragraphs shorter than this are skipped
    cut_fraction: float = 0.5    # prose prompt = text up to the sentence boundary nearest this fraction
    long_paragraph_words: int = 70  # a manual paragraph this long yields two prompts (cuts at 1/3, 2/3)
    literal_window: int = 8      # lines of a long literal shown in one structured prompt
    max_windows_per_literal: int = 24  # cap so one giant table cannot swamp the category


def _row(category: str, doc_name: str, line: int, prompt: str, continuation: str, cfg: EmbeddedConfig) -> dict | None:
    prompt, continuation = prompt.rstrip() + "\n", continuation.strip("\n")
    if not (cfg.min_chars <= len(prompt) <= cfg.max_chars) or not continuation.strip():
        return None
    if len(continuation) > cfg.max_reference_chars:
        cut = continuation.rfind("\n", 0, cfg.max_reference_chars)
        continuation = continuation[: cut if cut > 0 else cfg.max_reference_chars]
    return {"category": category, "subtask": category, "turns": [prompt], "reference": [continuation],
            "source": SOURCE_NAME, "source_id": f"{doc_name}:{line}"}


_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+(?=\S)")


def split_prose(text: str, fraction: float, min_words: int = 8) -> tuple[str, str] | None:
    """Cut ``text`` at the sentence boundary nearest ``fraction`` of its length (else a word boundary),
    leaving at least ``min_words`` words on each side; None when that is impossible."""
    words = text.split()
    if len(words) < 2 * min_words:
        return None
    target = fraction * len(text)
    cuts = [m.start() for m in _SENTENCE_END.finditer(text)]
    ok = [c for c in cuts if len(text[:c].split()) >= min_words and len(text[c:].split()) >= min_words]
    if ok:
        c = min(ok, key=lambda c: (abs(c - target), c))
    else:
        spaces = [m.start() for m in re.finditer(r"\s+", text)]
        c = min(spaces, key=lambda c: (abs(c - target), c))
    return text[:c].rstrip(), text[c:].strip()


def _lines(text: str, start: int, end: int) -> str:
    """Source lines ``start..end`` (1-based, inclusive)."""
    return "\n".join(text.splitlines()[start - 1 : end])


def code_completion(name: str, text: str, nodes: list[ast.AST], cfg: EmbeddedConfig) -> list[dict]:
    rows = []
    for node in nodes:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or docstring_of(node) is None:
            continue
        if len(node.body) < 2:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        head = textwrap.dedent(_lines(text, first, node.body[0].end_lineno))
        body = _lines(text, node.body[1].lineno, node.end_lineno)
        indent = len(_lines(text, node.lineno, node.lineno)) - len(_lines(text, node.lineno, node.lineno).lstrip())
        body = "\n".join(line[indent:] if line[:indent].isspace() else line for line in body.splitlines())
        row = _row("code_completion", name, first, head, body, cfg)
        if row:
            rows.append(row)
    return rows


def docstring(name: str, text: str, nodes: list[ast.AST], cfg: EmbeddedConfig) -> list[dict]:
    rows = []
    for node in nodes:
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = docstring_of(node)
        if doc is None or len(doc.split()) < cfg.min_prose_words:
            continue
        cut = split_prose(doc, cfg.cut_fraction)
        if cut:
            row = _row("docstring", name, node.body[0].lineno, cut[0], cut[1], cfg)
            if row:
                rows.append(row)
    # '#' comment blocks: >= 3 consecutive comment lines with enough words
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("#") and not lines[j].startswith("#!"):
            j += 1
        if j - i >= 3:
            block = textwrap.dedent("\n".join(lines[i:j]))
            if len(block.split()) >= cfg.min_prose_words + (j - i):
                k = max(1, round(cfg.cut_fraction * (j - i)))
                blines = block.splitlines()
                row = _row("docstring", name, i + 1, "\n".join(blines[:k]), "\n".join(blines[k:]), cfg)
                if row:
                    rows.append(row)
        i = max(j, i + 1)
    return rows


def _is_prose_paragraph(par: str, prev: str) -> bool:
    if par.startswith((" ", "\t")) or "::=" in par or prev.rstrip().endswith("::"):
        return False
    if re.match(r"^[-=*+\[]", par.lstrip()):  # headings, footnotes, tables
        return False
    return True


def reference_prose(name: str, text: str, cfg: EmbeddedConfig) -> list[dict]:
    rows, prev, line = [], "", 1
    for par in re.split(r"(\n\s*\n)", text):
        n_words = len(par.split())
        if par.strip() and _is_prose_paragraph(par, prev) and n_words >= cfg.min_paragraph_words:
            flat = " ".join(par.split())  # reflow: the manual's hard line breaks carry no meaning
            fractions = (1 / 3, 2 / 3) if n_words >= cfg.long_paragraph_words else (cfg.cut_fraction,)
            for k, fraction in enumerate(fractions):
                cut = split_prose(flat, fraction)
                row = cut and _row("reference_prose", name, line, cut[0], cut[1], cfg)
                if row:
                    row["source_id"] += f"#{k}" if len(fractions) > 1 else ""
                    rows.append(row)
        if par.strip():
            prev = par
        line += par.count("\n")
    return rows


def _literal_rows(name: str, text: str, nodes: list[ast.AST], cfg: EmbeddedConfig) -> list[dict]:
    rows, lines, w = [], text.splitlines(), cfg.literal_window
    for node in nodes:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        elts = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", None)
        if not isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set)) or elts is None or len(elts) < 4:
            continue
        start, end = node.lineno, node.end_lineno
        if end - start + 1 < 5:
            continue
        # window 0 opens with the assignment; later windows are evenly spaced cuts of the table
        n_windows = min(cfg.max_windows_per_literal, max(1, (end - start + 1) // (2 * w)))
        step = max(w, (end - start + 1 - w) // n_windows)
        for k in range(n_windows):
            a = start + k * step
            prompt_end = min(a + w - 1, end - 1) if k else min(start + max(w // 2, (end - start) // 2), end - 1)
            if prompt_end <= a:
                break
            prompt = textwrap.dedent("\n".join(lines[a - 1 : prompt_end]))
            cont = "\n".join(lines[prompt_end : min(prompt_end + w, end)])
            row = _row("structured", name, a, prompt, textwrap.dedent(cont), cfg)
            if row:
                rows.append(row)
    return rows


def _is_constant_like(value: ast.AST) -> bool:
    """A literal, a name, a dotted name, ``-1``, or a call of a name on such values (``frozenset("ab")``)."""
    if isinstance(value, (ast.Constant, ast.Name, ast.Attribute)):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.operand, ast.Constant):
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.keywords:
        return all(isinstance(a, (ast.Constant, ast.Name, ast.Attribute)) for a in value.args)
    return False


def _one_line_constant(stmt: ast.AST | None) -> bool:
    """A one-line assignment, plain or annotated, of a constant-like value (``hidden_size: int = 768``)."""
    return (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
            and stmt.lineno == stmt.end_lineno and _is_constant_like(stmt.value))


def _constant_runs(name: str, text: str, nodes: list[ast.AST], cfg: EmbeddedConfig, min_run: int = 5) -> list[dict]:
    """Runs of >= ``min_run`` consecutive one-line constant assignments (``START_ELEMENT = "..."``,
    a dataclass's ``vocab_size: int = 32000`` fields)."""
    rows, lines = [], text.splitlines()
    for node in nodes:
        body, run = getattr(node, "body", None), []
        if not isinstance(body, list):
            continue
        for stmt in body + [None]:
            ok = _one_line_constant(stmt) and (not run or stmt.lineno == run[-1].end_lineno + 1)
            if ok:
                run.append(stmt)
                continue
            if len(run) >= min_run:
                k = max(3, len(run) // 2)
                a, m, e = run[0].lineno, run[k].lineno, run[-1].end_lineno
                row = _row("structured", name, a, textwrap.dedent("\n".join(lines[a - 1 : m - 1])),
                           textwrap.dedent("\n".join(lines[m - 1 : e])), cfg)
                if row:
                    rows.append(row)
            run = [stmt] if _one_line_constant(stmt) else []
    return rows


def _grammar_blocks(name: str, text: str, cfg: EmbeddedConfig) -> list[dict]:
    rows, line = [], 1
    for par in re.split(r"(\n\s*\n)", text):
        plines = par.splitlines()
        if "::=" in par and len(plines) >= 3:
            k = max(1, len(plines) // 2)
            row = _row("structured", name, line, textwrap.dedent("\n".join(plines[:k])),
                       textwrap.dedent("\n".join(plines[k:])), cfg)
            if row:
                rows.append(row)
        line += par.count("\n")
    return rows


_BULLET = re.compile(r"^(\s*)(?:#\s*)?(?:[-*+]|\d+[.)]|\(\w\))\s+\S")


def _enumerations(name: str, text: str, cfg: EmbeddedConfig) -> list[dict]:
    """Bulleted / numbered lists (>= 4 items, continuation lines allowed) in docstrings, comments, prose."""
    rows, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if not _BULLET.match(lines[i]):
            i += 1
            continue
        j, starts = i, []
        while j < len(lines) and lines[j].strip():
            if _BULLET.match(lines[j]):
                starts.append(j)
            elif j == i or not lines[j].startswith(" "):
                break
            j += 1
        if len(starts) >= 4:
            k = starts[len(starts) // 2]
            row = _row("structured", name, i + 1, textwrap.dedent("\n".join(lines[i:k])),
                       textwrap.dedent("\n".join(lines[k:j])), cfg)
            if row:
                rows.append(row)
        i = max(j, i + 1)
    return rows


def structured(name: str, text: str, nodes: list[ast.AST] | None, cfg: EmbeddedConfig) -> list[dict]:
    if nodes is None:
        return _grammar_blocks(name, text, cfg) + _enumerations(name, text, cfg)
    return (_literal_rows(name, text, nodes, cfg) + _constant_runs(name, text, nodes, cfg)
            + _enumerations(name, text, cfg))


_CORPUS = None


def heldout_corpus():
    """The default corpus, built once per process (it depends only on the pinned source package)."""
    global _CORPUS
    if _CORPUS is None:
        from spade_lib.zoo.corpus import build_corpus

        _CORPUS = build_corpus()
    return _CORPUS


def embedded_candidates(categories: tuple[str, ...] = CATEGORIES, config: EmbeddedConfig | None = None,
                        corpus=None) -> list[dict]:
    """All candidate rows of ``categories`` from the held-out corpus documents (deterministic order)."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"categories: unknown embedded categories {unknown}; known: {list(CATEGORIES)}")
    cfg = config or EmbeddedConfig()
    corpus = corpus or heldout_corpus()
    rows = []
    for doc in corpus.heldout:
        nodes = None
        if doc.kind == "code":
            tree = parse(doc.text)  # warnings silenced: the same on every Python
            if tree is None:
                continue
            nodes = list(ast.walk(tree))  # breadth-first, deterministic
        found = {
            "code_completion": lambda: code_completion(doc.name, doc.text, nodes, cfg) if nodes else [],
            "docstring": lambda: docstring(doc.name, doc.text, nodes, cfg) if nodes else [],
            "reference_prose": lambda: reference_prose(doc.name, doc.text, cfg) if doc.kind == "prose" else [],
            "structured": lambda: structured(doc.name, doc.text, nodes, cfg),
        }
        for c in categories:
            part = found[c]()
            part.sort(key=lambda r: int(r["source_id"].rsplit(":", 1)[1].split("#")[0]))
            rows.extend(part)
    return rows
