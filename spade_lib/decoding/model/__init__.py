"""The model forward: how a target, a draft model or a draft head turns tokens into logits on this machine.

``adapter`` (:class:`~spade_lib.decoding.model.adapter.CausalLMAdapter`: prefill, extend by ``k`` rows, roll back;
the Hugging Face forward as reference and fallback), ``lean`` (the one decoder-layer description every covered
family runs: Llama, Qwen2, Gemma-3; 1 row, a ``k``-row chain or a tree block, weights held once) and ``lean_batch``
(the same weights for ``B`` ragged rows), ``kernels`` and ``native`` (the products and attention it runs on, chosen
by timing in :func:`~spade_lib.decoding.model.lean.prepare`), ``masks`` (which keys a query sees, defined once) and
``heads`` (the interface of a draft head on the target's hidden states and its draft vocabulary). Nothing here
knows about drafting or verification: the layers above call it.
"""
