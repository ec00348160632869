"""M3 rejection diagnostics: token-level traces in, tidy tables out.

Every function takes a trace (one row per drafted token, :mod:`spade_lib.runs.trace`'s schema; a DataFrame or a run
directory) and an optional ``by`` of grouping columns, and returns a tidy ``DataFrame`` (one row per group x position /
bin / token; variables as columns); figures are thin functions over these in :mod:`spade_lib.plots.m3`. Notation of
Leviathan et al. (2023): ``p`` target, ``q`` draft, ``x`` the drafted token, ``gamma`` draft length, ``alpha`` the
acceptance rate.

====================  =================================================================================================
module                what it answers
====================  =================================================================================================
``position``          acceptance by draft position (conditional, unconditional), accepted lengths, prompt x step heatmap
``correlates``        entropy at rejected vs accepted positions; acceptance vs H(p), H(q), TV, KL; logistic model, AUC
``calibration``       reliability of q(x) and min(1, p/q) as acceptance predictors; ECE
``expected``          realised accepts vs the exactly known expectation: a sampler test
``repetition``        repeated n-grams of generations (is greedy text a loop?), per run
``tokens``            per-token and per-token-class acceptance, decoded
``tree``              draft trees (and chains): acceptance by depth, sibling rank; first token; lengths; run summary
``tree_study``        notebook 04's draft-tree runs (chain, wide tree, smaller trees) and their tables
``crossvocab``        cross-vocabulary drafts: acceptance per target / draft token, tokenizer boundaries, sync costs
``summary``           per-category summary in Spec-Bench's shape, the run's tau beside it; ``all_tables``
``study``             notebook 04's runs (drafts, EAGLE per position), per-category speedups, the check of its drafts
``synthetic``         traces with known answers (tests, benchmarks)
``frame``, ``stats``  inputs (``combine_runs``), shared statistics (binomial CIs, AUC); rates: :mod:`spade_lib.rates`
====================  =================================================================================================
"""

from spade_lib.diagnose.calibration import calibration_error, calibration_table
from spade_lib.diagnose.correlates import (LogitFit, acceptance_by_bins, acceptance_logit, entropy_by_outcome,
                                          separated_fits)
from spade_lib.diagnose.crossvocab import (CrossVocabRuns, alignment_table, boundary_acceptance, greedy_divergences,
                                          run_crossvocab, step_costs, token_acceptance)
from spade_lib.diagnose.expected import expected_vs_realised, rejudge_wrong_q, wrong_q_power, wrong_q_study
from spade_lib.diagnose.frame import as_trace, categorize, combine_runs
from spade_lib.diagnose.position import accept_length_hist, acceptance_heatmap, position_acceptance
from spade_lib.diagnose.repetition import attractor, repetition_rate, repetition_table
from spade_lib.diagnose.stats import auc, binomial_ci, poisson_binomial_z
from spade_lib.diagnose.summary import all_tables, category_summary, with_run_tau
from spade_lib.diagnose.synthetic import expected_position_acceptance, synthetic_trace
from spade_lib.diagnose.tokens import (decode_tokens, off_head_rejections, token_class, token_class_acceptance,
                                      token_table)
from spade_lib.diagnose.tree import (depth_acceptance, root_acceptance, sibling_acceptance, tree_accept_length_hist,
                                   tree_summary)

__all__ = [
    "CrossVocabRuns", "LogitFit", "accept_length_hist", "alignment_table", "boundary_acceptance", "greedy_divergences", "run_crossvocab",
    "step_costs", "token_acceptance", "acceptance_by_bins", "acceptance_heatmap", "acceptance_logit",
    "all_tables", "as_trace", "auc", "binomial_ci", "calibration_error", "calibration_table",
    "categorize", "category_summary", "combine_runs", "decode_tokens", "depth_acceptance", "entropy_by_outcome",
    "expected_position_acceptance", "expected_vs_realised", "poisson_binomial_z", "rejudge_wrong_q", "wrong_q_power",
    "position_acceptance", "sibling_acceptance", "attractor", "repetition_rate", "repetition_table", "synthetic_trace", "token_class", "token_class_acceptance",
    "token_table", "off_head_rejections", "tree_accept_length_hist", "tree_summary",
    "root_acceptance", "separated_fits", "with_run_tau", "wrong_q_study",
]
