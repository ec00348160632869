"""Traces in the tools people use: DuckDB's SQL over a run's Parquet shard folder gives the same
per-position acceptance as :func:`spade_lib.diagnose.position_acceptance`.

``README_QUERY`` is the README's one-line query (``{run_dir}`` a run folder): per draft position
``i``, the conditional acceptance ``alpha_i = accepted / reached`` and the unconditional
``beta_i = accepted / drafted``. The glob ``[!.]*.parquet`` skips the hidden temporary of a write that
was interrupted (DuckDB's ``*`` matches hidden files), as :func:`spade_lib.runs.trace.shard_paths` does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spade_lib import diagnose
from spade_lib.bench import Suite
from spade_lib.runs import runner
from spade_lib.runs.config import RunConfig

duckdb = pytest.importorskip("duckdb", reason="pip install duckdb (pinned in requirements.txt)")

README_QUERY = ("SELECT pos, count(*) AS drafted, avg(accepted::INT) FILTER (WHERE reached) AS alpha_cond, "
                "avg(accepted::INT) AS alpha_uncond FROM '{run_dir}/trace/[!.]*.parquet' GROUP BY pos ORDER BY pos")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    pair = load_pair("tiny")
    rows = [{"question_id": i, "category": ("code", "prose")[i % 2],
             "turns": ["def f(x):\n    return" if i % 2 == 0 else f"The number {i} is"]} for i in range(4)]
    config = RunConfig(temperature=1.0, gamma=4, max_new_tokens=24, n_samples=2, device="cpu", threads=1,
                       warmup=0)
    d = runner.run_suite(pair, Suite("mini", rows, {}), config, tmp_path_factory.mktemp("duck") / "run",
                         progress=False)
    torch.set_num_threads(before)
    (d / "trace" / ".3.parquet.tmp.parquet").write_bytes(b"half-written")  # as a killed writer leaves it
    return d


def test_readme_query_matches_diagnose(run_dir):
    got = duckdb.sql(README_QUERY.format(run_dir=run_dir)).df()
    want = diagnose.position_acceptance(run_dir)
    assert len(want) == 4 and want["reached"].sum() > want["accepted"].sum() > 0  # some rejections happened
    assert got["pos"].tolist() == want["pos"].tolist()
    assert got["drafted"].tolist() == want["drafted"].tolist()
    np.testing.assert_allclose(got["alpha_cond"], want["alpha_cond"], rtol=1e-12)
    np.testing.assert_allclose(got["alpha_uncond"], want["alpha_uncond"], rtol=1e-12)


def test_grouped_counts_match_diagnose(run_dir):
    """Counts per category and position, from SQL over the shard folder as a DuckDB view."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW trace AS SELECT * FROM read_parquet('{run_dir}/trace/[!.]*.parquet')")
    got = con.execute("""
        SELECT category, pos, count(*) AS drafted, count(*) FILTER (WHERE reached) AS reached,
               count(*) FILTER (WHERE accepted) AS accepted, avg(1 - tv) FILTER (WHERE reached) AS expected_cond
        FROM trace GROUP BY category, pos ORDER BY category, pos""").df()
    want = diagnose.position_acceptance(run_dir, by="category")
    for col in ("pos", "drafted", "reached", "accepted"):
        assert got[col].tolist() == want[col].tolist(), col
    assert got["category"].tolist() == want["category"].astype(str).tolist()
    # tv is float32 in Parquet: DuckDB and numpy sum it in different orders
    np.testing.assert_allclose(got["expected_cond"], want["expected_cond"], rtol=1e-6)
    con.close()
