"""Processing candidate prompts into a suite: dedup, token lengths and tiers, seeded stratified sampling.

- **Dedup.** Two prompts are duplicates when their turns are equal after normalisation
  ``norm(t) = casefold(NFKC(t))`` with every run of whitespace collapsed to one space and the ends
  stripped. The first occurrence (in source order) is kept; ``exact`` counts byte-equal duplicates,
  ``normalised`` the further ones that only normalisation reveals.
- **Lengths.** ``n_tokens = len(tokenizer.encode(text, add_special_tokens=False))`` of the first
  turn, where ``text`` is the turn itself or, with a chat template, the rendered one-message chat with
  the generation prompt. Tiers: ``short`` if ``n_tokens < edges[0]``, ``medium`` if ``< edges[1]``,
  else ``long`` — fixed edges, so tiers mean the same thing in every suite built with them.
- **Sampling.** Per category, candidates in source order are shuffled by
  ``random.Random(f"{seed}:{category}")`` and the first ``n`` are kept (then restored to source
  order). A category's draw therefore does not depend on the other categories, and with the same seed
  the ``n``-prompt sample is a subset of the ``m``-prompt sample for ``n < m``.
"""

from __future__ import annotations

import random
import re
import unicodedata
from typing import Any

DEFAULT_TIER_EDGES = (32, 128)  # tokens: short < 32 <= medium < 128 <= long


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def dedup(rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """Drop exact and normalised-text duplicates (comparing all turns); keep the first occurrence."""
    seen_exact, seen_norm, kept = set(), set(), []
    counts = {"exact": 0, "normalised": 0}
    for r in rows:
        exact = tuple(r["turns"])
        norm = tuple(normalise(t) for t in r["turns"])
        if exact in seen_exact:
            counts["exact"] += 1
        elif norm in seen_norm:
            counts["normalised"] += 1
        else:
            kept.append(r)
        seen_exact.add(exact)
        seen_norm.add(norm)
    return kept, counts


def resolve_tokenizer(tokenizer: Any) -> tuple[Any, str]:
    """``(tokenizer object, name)``: a name is loaded with :func:`spade_lib.zoo.pairs.load_tokenizer`."""
    if tokenizer is None:
        return None, None
    if isinstance(tokenizer, str):
        try:
            from spade_lib.zoo.pairs import load_tokenizer
        except ImportError as e:
            raise ValueError(f"tokenizer={tokenizer!r}: loading by name needs spade_lib.zoo.pairs.load_tokenizer "
                             f"({e}); pass a tokenizer object instead") from None
        return load_tokenizer(tokenizer), tokenizer
    if not callable(getattr(tokenizer, "encode", None)):
        raise ValueError(f"tokenizer must be a name or an object with .encode(), got {type(tokenizer).__name__}")
    return tokenizer, getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def tokenizer_info(tokenizer: Any, name: str | None) -> dict | None:
    """Name, class, vocabulary size and a sha256 of the serialised tokenizer (fast tokenizers)."""
    if tokenizer is None:
        return None
    import hashlib

    info = {"name": name, "class": type(tokenizer).__name__, "vocab_size": len(tokenizer)
            if hasattr(tokenizer, "__len__") else None}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        info["sha256"] = hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()
    return info


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(text: str, tokenizer: Any, chat_template: bool | str = "auto") -> str:
    """The text fed to the model for one user turn: raw, or in the tokenizer's chat template.

    ``chat_template``: ``"auto"`` uses the template when the tokenizer has one, ``True`` requires it,
    ``False`` never uses it."""
    if chat_template not in (True, False, "auto"):
        raise ValueError(f"chat_template must be True, False or 'auto', got {chat_template!r}")
    use = has_chat_template(tokenizer) if chat_template == "auto" else chat_template
    if not use:
        return text
    if not has_chat_template(tokenizer):
        raise ValueError("chat_template=True but the tokenizer has no chat template")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def count_tokens(text: str, tokenizer: Any, chat_template: bool | str = "auto") -> int:
    text = render_prompt(text, tokenizer, chat_template)
    try:  # verbose=False: counting a long prompt is not an attempt to feed it to a model
        return len(tokenizer.encode(text, add_special_tokens=False, verbose=False))
    except TypeError:
        return len(tokenizer.encode(text, add_special_tokens=False))


def length_tier(n_tokens: int | None, edges: tuple[int, int] = DEFAULT_TIER_EDGES) -> str | None:
    if n_tokens is None:
        return None
    return "short" if n_tokens < edges[0] else "medium" if n_tokens < edges[1] else "long"


def check_tier_edges(edges: tuple[int, int]) -> tuple[int, int]:
    edges = tuple(edges)
    if len(edges) != 2 or not all(isinstance(e, int) for e in edges) or not 0 < edges[0] < edges[1]:
        raise ValueError(f"tier_edges must be two increasing positive ints, got {edges!r}")
    return edges


def group_by_category(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["category"], []).append(r)
    return groups


def stratified_sample(rows: list[dict], n_per_category: int | None, seed: int,
                      categories: list[str] | None = None, allow_fewer: bool = False) -> tuple[list[dict], dict]:
    """Seeded sample of ``n_per_category`` rows from each category (all of them when None).

    Returns the rows (categories in the order given, else first appearance) and
    ``{category: {"available", "selected"}}``. Asking for more than a category holds raises
    ``ValueError`` unless ``allow_fewer``; a requested category without candidates always raises."""
    if n_per_category is not None and (not isinstance(n_per_category, int) or n_per_category < 1):
        raise ValueError(f"n_per_category must be a positive int or None, got {n_per_category!r}")
    groups = group_by_category(rows)
    if categories is None:
        categories = list(groups)
    unknown = [c for c in categories if c not in groups]
    if unknown:
        raise ValueError(f"categories: no prompts for {unknown} (after filtering); "
                         f"known categories: {sorted(groups)}")
    out, stats = [], {}
    for c in categories:
        cands = groups[c]
        n = len(cands) if n_per_category is None else n_per_category
        if n > len(cands) and not allow_fewer:
            raise ValueError(f"n_per_category={n} but category {c!r} has only {len(cands)} prompts "
                             f"(after dedup and length filters); lower it or pass allow_fewer=True")
        order = list(range(len(cands)))
        random.Random(f"{seed}:{c}").shuffle(order)
        chosen = sorted(order[: min(n, len(cands))])
        out.extend(cands[i] for i in chosen)
        stats[c] = {"available": len(cands), "selected": len(chosen)}
    return out, stats


def length_stats(rows: list[dict]) -> dict:
    """Per category and overall: count, min, median, mean, max of ``n_tokens`` and tier counts."""
    import statistics

    def summary(rs: list[dict]) -> dict:
        ns = [r["n_tokens"] for r in rs if r.get("n_tokens") is not None]
        tiers = {t: sum(r.get("length_tier") == t for r in rs) for t in ("short", "medium", "long")}
        if not ns:
            return {"n": len(rs)}
        return {"n": len(rs), "min": min(ns), "median": float(statistics.median(ns)),
                "mean": round(statistics.fmean(ns), 3), "max": max(ns), "tiers": tiers}

    out = {c: summary(rs) for c, rs in group_by_category(rows).items()}
    out["_all"] = summary(rows)
    return out
