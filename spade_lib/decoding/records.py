"""The decoder's record layout: the names of the trace columns, in groups.

Pure names, no storage: :mod:`spade_lib.runs.trace` gives each column its Arrow type
(``TRACE_SCHEMA``, whose column order is ``ROW_KEYS + RECORD_COLUMNS``) and checks on import that it
agrees with the groups here. The decoders (:mod:`spade_lib.decoding.decode`,
:mod:`spade_lib.decoding.batch`) build their records from these names, and every analysis of a trace
identifies a step by ``STEP_KEYS``; nothing else lists columns.
"""

from __future__ import annotations

# added by the runner per generation: which prompt, its category, which sample
ROW_KEYS: tuple[str, ...] = ("prompt_id", "category", "sample")
# a trace's step identity (a list: pandas reads a tuple of keys as one key)
STEP_KEYS: list[str] = ["prompt_id", "sample", "step"]
# step-level facts, repeated on every row of the step
STEP_COLUMNS: tuple[str, ...] = ("step", "gamma", "n_accepted", "next_token", "t_draft", "t_verify", "t_overhead")
# a drafted token's place in its block / the text
BLOCK_COLUMNS: tuple[str, ...] = ("pos", "abs_pos")
# a drafted token's place in its draft tree (spade_lib.decoding.tree; trace schema v2): its node index, its parent
# node (-1: the root), depth (0: a child of the root) and rank among its siblings; a chain's node i has
# node = i, parent = i - 1, depth = i, sibling_rank = 0. GenerationResult.records() fills them for every row and
# keeps those RECORD_COLUMNS lists.
TREE_COLUMNS: tuple[str, ...] = ("node", "parent", "depth", "sibling_rank")
# one record per drafted token, as the decoder writes it (the trace's columns minus ROW_KEYS, in order)
RECORD_COLUMNS: tuple[str, ...] = (
    "step", "pos", "abs_pos", "gamma", "draft_token", "p_x", "q_x", "accept_prob", "uniform", "reached",
    "accepted", "n_accepted", "next_token", "h_p", "h_q", "tv", "kl", "p_top1", "p_margin", "q_top_prob",
    "p_x_raw", "q_x_raw", "h_p_raw", "h_q_raw", "tv_raw", "t_draft", "t_verify", "t_overhead",
)
# per-position statistics the decoder computes for each drafted token (one named tensor each)
POSITION_STATS: tuple[str, ...] = tuple(n for n in RECORD_COLUMNS if n not in STEP_COLUMNS + BLOCK_COLUMNS)
# the statistics stored as integers and as booleans (the rest are floats)
INT_STATS: frozenset[str] = frozenset({"draft_token", "p_top1"})
BOOL_STATS: frozenset[str] = frozenset({"reached", "accepted"})
