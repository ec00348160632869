"""One caption per SPADE figure: what a reader of the run report sees under each image.

A figure is saved as ``<base>`` or ``<base>-<pair>`` (``spade_lib.experiment.figure_name``: the
embedded ``default`` pair keeps the bare base); ``CAPTIONS`` is keyed by the base, so every pair's copy
of a figure shares its caption. A figure missing here gets, in the report, the first sentence of the
markdown cell before the notebook cell that saves it (:func:`spade_lib.report.summarize`); add its line
here when you add a figure.
"""

from __future__ import annotations

CAPTIONS: dict[str, str] = {
    # notebook 01: the benchmark
    "m1_prompt_lengths": "Prompt lengths per category in tokens of the pair's tokenizer (log scale).",
    # notebook 02: the acceptance math
    "m2_alpha_overlap": "alpha = 1 - TV(p, q): the acceptance rate is the overlap of the target and draft "
                        "distributions.",
    "m2_expected_tokens": "Expected tokens per verification step against the draft length gamma for several alpha "
                          "(Leviathan et al. Eq. 1).",
    "m2_speedup_vs_gamma": "Predicted speedup against gamma from the cost model, priced with the pair's measured "
                           "c, r(g) and loop overhead.",
    "m2_optimal_gamma_map": "The speedup-maximising draft length, and the speedup it gives, over alpha and the "
                            "cost ratio c.",
    # notebook 03: measured speedups
    "m2_speedup_runs": "Measured speedup over autoregressive decoding of every configuration, with 95 % bootstrap "
                       "intervals, and the cost-model prediction (hollow diamonds).",
    "m2_speedup_by_category": "Measured speedup per suite category at gamma_ref, with intervals; each bar "
                              "labelled with its generations.",
    "m2_predicted_vs_measured": "Each run's cost-model prediction against its measured speedup; points below the "
                                "diagonal are per-step overheads the model leaves out.",
    "m2_early_exit_alpha": "An untrained early-exit draft: acceptance at T = 0 and T = 1 and the cost ratio c_k "
                           "per exit layer k of the target.",
    "m2_speedup_vs_batch": "Throughput and speedup of batched speculative decoding against batch size, measured "
                           "and predicted.",
    # notebook 04: rejection diagnostics
    "m3_acceptance_by_position": "Conditional and unconditional acceptance per draft position with Wilson "
                                 "intervals and the exact expectation mean(1 - TV); labels: positions reached.",
    "m3_accept_length_hist": "Distribution and survival of the number of accepted drafts per verification step; "
                             "labels: steps.",
    "m3_entropy_rejected_vs_accepted": "Target and draft entropy at accepted vs rejected positions (median and "
                                       "interquartile range) per draft position.",
    "m3_acceptance_vs_entropy": "Conditional acceptance in equal-count bins of entropy and divergence, with the "
                                "exact expectation 1 - TV per bin; labels: positions per bin.",
    "m3_logit_coefficients": "Standardised logistic-regression coefficients of acceptance on position, entropies "
                             "and draft confidence, with 95 % intervals.",
    "m3_calibration": "Reliability diagrams: empirical acceptance against the draft's confidence and the exact "
                      "acceptance probability, with the ECE.",
    "m3_calibration_greedy_top1": "EAGLE-2's calibration under greedy decoding: the draft's top-1 confidence "
                                  "against the target's agreement.",
    "m3_expected_vs_realised": "Realised acceptance per position against its exactly known expectation, with "
                               "the p-value of each: a test of the sampler.",
    "m3_token_rejections": "The most rejected draft tokens, labelled with how often each was judged.",
    "m3_category_summary": "Mean accepted length tau per suite category and draft; labels: generations.",
    "m3_acceptance_heatmap": "Fraction of drafts kept per generation (rows, by category) and verification step.",
    "m3_tree_depth_acceptance": "Draft trees: acceptance by depth given the parent was reached, per run; "
                                "labels: steps judged.",
    "m3_tree_sibling_acceptance": "Draft trees: acceptance by sibling rank at each depth; labels: nodes judged.",
    "m3_tree_accept_length_hist": "Draft trees: accepted path length per verification step; labels: steps.",
    "m3_tree_tau_vs_budget": "tau against the node budget: smaller trees replayed from the wide one, and the "
                             "real runs with their intervals.",
    "m3_crossvocab_costs": "Drafts across vocabularies: acceptance per target and per draft token, and the "
                           "drafter's time per step split into forwards and text sync.",
    "m3_crossvocab_boundaries": "Drafts across vocabularies: acceptance by the target token's kind against the "
                                "draft's token boundaries, and where the first rejections fall.",
    # notebook 05: what-if replay
    "m3_whatif_predicted_tau": "Teacher-forced predictions of tau and speedup for every gamma from one run, with "
                               "the measured points of the sweep; labels: full-length blocks.",
    "m3_whatif_rules": "Acceptance rules replayed on one stored trace: the tau each rule would have given on "
                       "the same blocks; labels: steps.",
    "m3_whatif_stop_frontier": "Stop rules replayed on a max-gamma trace: tokens per step against the cost per "
                               "step, per temperature (titles: steps replayed).",
}


def caption(name: str) -> str | None:
    """The caption of figure ``name`` (a base, or ``<base>-<pair>``), or None for a figure not listed."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: a figure name like 'm2_speedup_runs-smollm2', got {name!r}")
    if name in CAPTIONS:
        return CAPTIONS[name]
    base = max((b for b in CAPTIONS if name.startswith(b + "-")), key=len, default=None)
    return CAPTIONS[base] if base is not None else None
