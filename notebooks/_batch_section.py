# Cells of notebook 03's section "Batch size" (issue 17), to be inserted by the lead before "## Invariants".
# Cells are separated by "# %%" markers; "# %% [markdown]" cells are markdown (their lines start with "# ").
#
# Uses notebook 03's globals: the_pair, the_suite, runner, template, max_prompt_tokens, main_draft, gamma_ref,
# temperatures, seed, pd, np, save_figure.
# New parameters for the `parameters` cell (typed, commented):
#     batch_sizes: list[int] = [1, 2, 4, 8, 16]  # rows decoded together in the batch study
#     batch_max_new_tokens: int = 32  # tokens per row in the batch study
#     batch_repeats: int = 1  # timed batches per point of the batch study (the median is kept)
# and for params/smoke/03_m2_speedup_runs.yaml:
#     batch_sizes: [1, 2, 4]
#     batch_max_new_tokens: 8

# %% [markdown]
# ## Batch size: where speculation stops paying
#
# Serving systems decode many sequences at once. A batched decoder step costs a forward over `B` rows;
# while the hardware is memory-bound that costs little more than one row, and speculation buys
# `E[tokens]` per target call almost for free. As `B` grows the step turns compute-bound: verifying
# `gamma + 1` tokens for each of `B` rows costs up to `gamma + 1` times a one-token step, and the speedup
# shrinks. `spade_lib.batch` decodes a batch of prompts exactly (`SpeculativeDecoder.generate_batch`):
# left padding, explicit position ids, and **per-row lengths with masked holes** — every step appends
# `G + 1` cache slots to every row, a row's rejected drafts are masked out forever, so each row
# accepts its own number of drafts (ragged) while the batched `DynamicCache` is only ever cropped where
# every row has a hole. Each row draws from its own seeded generators, so its tokens do not depend on
# its batch-mates.
#
# For each batch size `B` and temperature the study decodes `B` suite prompts with batched
# autoregressive and batched speculative decoding (`gamma_ref`, the main draft) and reports the
# throughput (all rows' new tokens per second) and the speedup at equal `B`. Beside it, the theory:
# `speedup = E[tokens] / (gamma c(B) + r(B))` (`spade_lib.theory.speedup`) with `alpha` measured from
# the speculative steps, `r(B)` the measured cost of a `B x (gamma + 1)`-token target forward relative
# to a `B x 1` one, and `c(B)` the draft's `B x 1` forward relative to the target's. The prediction
# counts only the forwards; the measured speedup also pays for the loop around them.

# %%
from spade_lib.batch import BatchStudyConfig, batch_study, stops_paying
from spade_lib.plots.batch import plot_speedup_vs_batch

batch_cfg = runner.RunConfig(max_prompt_tokens=max_prompt_tokens, chat_template=template)
batch_prompts = [runner.prompt_ids(the_pair.tokenizer, r["turns"][0], batch_cfg) for r in the_suite.rows]
study_cfg = BatchStudyConfig(batch_sizes=tuple(batch_sizes), gamma=gamma_ref, temperatures=tuple(temperatures),
                             max_new_tokens=batch_max_new_tokens, repeats=batch_repeats, seed=seed)
t0 = time.perf_counter()
study = batch_study(the_pair.target, the_pair.drafts[main_draft], batch_prompts, study_cfg,
                    tokenizer=the_pair.tokenizer)
print(f"batch study: {len(study)} points from {len(batch_prompts)} prompts in {time.perf_counter() - t0:.0f} s")
study.round(3)

# %%
measured_stop, predicted_stop = stops_paying(study), stops_paying(study, "predicted")
for T in study_cfg.temperatures:
    at = study[study.temperature == T].set_index("batch_size")
    first, last = at.index.min(), at.index.max()
    print(f"T = {T:g}: speedup {at.loc[first, 'speedup']:.2f} at B = {first} -> {at.loc[last, 'speedup']:.2f} "
          f"at B = {last} (predicted {at.loc[first, 'predicted']:.2f} -> {at.loc[last, 'predicted']:.2f}); "
          f"r(B) {at.loc[first, 'r']:.2f} -> {at.loc[last, 'r']:.2f}; speculation stops paying at "
          f"B = {measured_stop[T] if measured_stop[T] is not None else 'never (in this range)'} measured, "
          f"{predicted_stop[T] if predicted_stop[T] is not None else 'never (in this range)'} predicted")
_ = save_figure(plot_speedup_vs_batch(study), "m2_speedup_vs_batch")

# %% [markdown]
# **Exactness of the batched rows.** Batched greedy rows must equal single-sequence greedy decoding
# (a mismatch is allowed only at a near tie of the target's logits, classified by `compare_greedy`),
# and the study's table must be consistent: same tokens counted for both methods when greedy, rates in
# their ranges.

# %%
from spade_lib.decode import SpeculativeDecoder
from spade_lib.divergence import compare_greedy
from spade_lib.sampling import SamplingConfig

check_B = min(len(batch_prompts), max(batch_sizes))
check_dec = SpeculativeDecoder(the_pair.target, the_pair.drafts[main_draft], gamma=gamma_ref,
                               sampling=SamplingConfig(temperature=0), record=False)
batched = check_dec.generate_batch(batch_prompts[:check_B], batch_max_new_tokens)
kinds = {"identical": 0, "near_tie": 0, "bug": 0}
for r, ids in zip(batched, batch_prompts[:check_B]):
    kinds[compare_greedy(r.tokens, check_dec.generate(ids, batch_max_new_tokens).tokens, the_pair.target,
                         ids).classification] += 1
print(f"batched greedy rows vs single greedy decoding, B = {check_B}: {kinds}")
assert kinds["bug"] == 0
greedy_rows = study[study.temperature == 0]
assert (greedy_rows["spec_tokens"] == greedy_rows["ar_tokens"]).all()
assert study["alpha"].between(0, 1).all() and (study["r"] > 0).all() and (study["speedup"] > 0).all()
