"""Which tokens drafts get rejected on: per-token and per-token-class acceptance, decoded to text.

Over reached positions, per token ``t`` (the drafted token ``x`` by default, or the target's top-1
``p_top1``): ``n_t`` judged, ``k_t`` accepted, ``rate_t = k_t / n_t`` with binomial bounds, and
``rejected_share_t = (n_t - k_t) / sum_t (n_t - k_t)``, the token's share of all rejections. Tokens
with ``n_t < min_support`` are dropped so rates are not dominated by noise.

**Off the draft's head** (:func:`off_head_rejections`): a draft whose head scores a subset ``H`` of the vocabulary
(FR-Spec) has ``q = 0`` off ``H``, so where the target's token lies off ``H`` no draft can match it. At a chain's
rejection the token emitted is the target's (``next_token``: the residual draw, the argmax at ``T = 0``); the share
of rejections whose emitted token is off ``H`` splits "the head could not say it" from "the model disagreed".

Token classes group decoded text by shape (checked in this order): ``whitespace`` (only blanks and
newlines), ``identifier`` (a name, optionally after leading blanks: ``" self"``), ``number``,
``punctuation`` (operators and brackets only), ``other`` (mixed); e.g. whitespace vs identifiers
in code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from spade_lib.decoding.records import STEP_KEYS
from spade_lib.diagnose.frame import By, Groups, TraceLike, as_trace, group_keys
from spade_lib.rates import add_rate

TOKEN_CLASSES = ("whitespace", "identifier", "number", "punctuation", "other")


def decode_tokens(ids: Iterable[int], tokenizer: Any = None) -> dict[int, str]:
    """Text of each id: ``tokenizer.decode([id])`` when it has ``decode``, else
    ``convert_ids_to_tokens`` / ``id_to_token``; ``None`` gives the id as a string (``"<17>"``)."""
    ids = [int(i) for i in ids]
    if tokenizer is None:
        return {i: f"<{i}>" for i in ids}
    if hasattr(tokenizer, "decode"):
        return {i: tokenizer.decode([i]) for i in ids}
    for name in ("convert_ids_to_tokens", "id_to_token"):
        if hasattr(tokenizer, name):
            fn = getattr(tokenizer, name)
            return {i: str(fn(i)) for i in ids}
    raise ValueError(f"tokenizer must have decode, convert_ids_to_tokens or id_to_token, "
                     f"got {type(tokenizer).__name__}")


def show_text(text: str) -> str:
    """Printable form of a token: spaces as '·', newlines and tabs escaped (for tables and plots)."""
    return text.replace(" ", "·").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def token_class(text: str) -> str:
    """Shape class of a decoded token (module docstring)."""
    if text.strip() == "":
        return "whitespace"
    core = text.lstrip()
    if core.isidentifier():
        return "identifier"
    if core.replace(".", "", 1).replace("_", "").isdigit():
        return "number"
    if all(not ch.isalnum() and not ch.isspace() and ch != "_" for ch in core):
        return "punctuation"
    return "other"


def _token_counts(trace: TraceLike, by: By, token: str) -> tuple[pd.DataFrame, list[str]]:
    df = as_trace(trace, ("reached", "accepted", token))
    keys = group_keys(by, df)
    g = Groups.of(df, keys + [token], mask=df["reached"].to_numpy(dtype=bool))
    t = g.frame().rename(columns={token: "token"})
    t["token"] = t["token"].astype(np.int64)
    t["n"] = g.sum()
    t["accepted"] = g.sum(df["accepted"].to_numpy(dtype=bool)).astype(np.int64)
    t["rejected"] = t["n"] - t["accepted"]
    return t, keys


def token_table(trace: TraceLike, tokenizer: Any = None, by: By = None, *, token: str = "draft_token",
                min_support: int = 20, level: float = 0.95, method: str = "wilson") -> pd.DataFrame:
    """Per ``by`` group and token with ``n >= min_support``: ``token``, ``text``, ``display``,
    ``token_class``, ``n``, ``accepted``, ``rejected``, ``rate`` (bounds), ``rejected_share``;
    sorted by most rejections first."""
    if min_support < 1:
        raise ValueError(f"min_support must be >= 1, got {min_support}")
    t, keys = _token_counts(trace, by, token)
    total_rej = t.groupby(keys, observed=True)["rejected"].transform("sum") if keys else t["rejected"].sum()
    t["rejected_share"] = t["rejected"] / np.maximum(total_rej, 1)
    t = t[t["n"] >= min_support].copy()
    text = decode_tokens(t["token"].unique(), tokenizer)
    t.insert(len(keys) + 1, "text", t["token"].map(text))
    t.insert(len(keys) + 2, "display", t["text"].map(show_text))
    t.insert(len(keys) + 3, "token_class", t["text"].map(token_class))
    add_rate(t, "accepted", "n", "rate", level, method)
    return t.sort_values(keys + ["rejected", "token"], ascending=[True] * len(keys) + [False, True],
                         kind="stable").reset_index(drop=True)


def token_class_acceptance(trace: TraceLike, tokenizer: Any = None, by: By = None, *,
                           token: str = "draft_token", level: float = 0.95,
                           method: str = "wilson") -> pd.DataFrame:
    """Acceptance per ``by`` group and token class (all tokens, no support cut): ``token_class``,
    ``tokens`` (distinct ids), ``n``, ``accepted``, ``rejected``, ``rate`` (bounds), ``rejected_share``."""
    t, keys = _token_counts(trace, by, token)
    text = decode_tokens(t["token"].unique(), tokenizer)
    t["token_class"] = pd.Categorical(t["token"].map(text).map(token_class), categories=TOKEN_CLASSES)
    out = t.groupby(keys + ["token_class"], observed=True, sort=True).agg(
        tokens=("token", "nunique"), n=("n", "sum"), accepted=("accepted", "sum"),
        rejected=("rejected", "sum")).reset_index()
    out["token_class"] = out["token_class"].astype(str)
    add_rate(out, "accepted", "n", "rate", level, method)
    total = out.groupby(keys, observed=True)["rejected"].transform("sum") if keys else out["rejected"].sum()
    out["rejected_share"] = out["rejected"] / np.maximum(total, 1)
    return out


def off_head_rejections(trace: TraceLike, heads: dict[str, Iterable[int]], by: str = "draft", *,
                        level: float = 0.95, method: str = "wilson") -> pd.DataFrame:
    """Per group of ``by`` named in ``heads`` (group -> the token ids its draft head scores): ``rejections`` (the
    steps that rejected: a chain's one reached, rejected position; a tree's siblings counted once), ``off_head``
    (those whose emitted ``next_token`` lies off the head) and
    ``off_head_share = off_head / rejections`` with binomial bounds (module docstring); groups of ``by`` not in
    ``heads`` (a full-vocabulary draft: no token is off its head) are left out."""
    if not isinstance(heads, dict) or not heads:
        raise ValueError(f"heads: a non-empty dict of group -> head token ids, got {type(heads).__name__}")
    df = as_trace(trace, (by, *STEP_KEYS, "reached", "accepted", "next_token"))
    rows = []
    for name, ids in heads.items():
        head = np.unique(np.asarray(list(ids), dtype=np.int64))
        sub = df[(df[by] == name) & df["reached"].astype(bool) & ~df["accepted"].astype(bool)]
        # one emitted token a step: a tree rejects several siblings of a step, which all share its next_token
        emitted = sub.drop_duplicates(STEP_KEYS)["next_token"].to_numpy(dtype=np.int64)
        rows.append({by: name, "head_size": int(head.size), "rejections": int(emitted.size),
                     "off_head": int((~np.isin(emitted, head)).sum())})
    out = pd.DataFrame(rows)
    add_rate(out, "off_head", "rejections", "off_head_share", level, method)
    return out
