"""vLLM's speculators format for EAGLE-3 heads, both ways: a SPADE :class:`~spade_lib.decoding.drafts.eagle.EagleHead`
saved as a folder that ``speculators`` (0.9.0) and vLLM load, and any EAGLE-3 folder loaded into one.

A speculators EAGLE-3 folder (``Eagle3DraftModel.save_pretrained``, checked against the package) holds:

- ``config.json``: ``speculators_model_type: "eagle3"``, ``architectures: ["Eagle3DraftModel"]``,
  ``speculators_version``, ``draft_vocab_size`` (``Vd``), ``eagle_aux_hidden_state_layer_ids`` (layers ``l``: vLLM
  captures ``hidden_states + residual`` entering ``l``, HF's ``hidden_states[l]``; default ``[2, L // 2, L - 3]``),
  ``norm_before_residual`` (always written; vLLM's default: True), ``norm_before_fc``, ``fc_norm``, ``norm_output``,
  ``embed_requires_grad``, ``target_hidden_size``, ``transformer_layer_config`` (a 1-layer Llama config, vocabulary
  ``V``), ``speculators_config`` (``algorithm: "eagle3"``, ``proposal_methods: [{proposal_type: "greedy",
  speculative_tokens: k, ...}]``, ``default_proposal_method: "greedy"``, ``verifier: {name_or_path, architectures}``);
- ``model.safetensors``: ``fc.weight [H, 3H]``; ``layers.0.self_attn.{q,k,v}_proj.weight [.., 2H]``,
  ``layers.0.self_attn.o_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.{input_layernorm,post_attention_layernorm,hidden_norm}.weight``; ``norm.weight``; ``lm_head.weight [Vd,
  H]``; ``d2t [Vd]`` int64 (draft row ``j`` is target id ``j + d2t[j]``); ``t2d [V]`` bool (only when ``Vd < V``);
  optional ``embed_tokens.weight [V, H]`` (absent: loaders take the verifier's; vLLM shares the target's).

**A Gemma-3 verifier** (``verifier.architectures: ["Gemma3ForCausalLM"]``): the draft layer stays Llama, ``d2t`` /
``t2d`` map into Gemma's 262,144 ids, and SPADE's head embeds ``s E x`` (``s = sqrt(H)``, the extra key ``embed_scale``)
where speculators' ``Eagle3DraftModel`` (0.9.0) computes ``input_layernorm(E x)``: as ``rmsnorm(s e; eps) = rmsnorm(e;
eps / s^2)`` the two differ only through ``eps`` (``1e-6`` against ``mean(e^2)``); a folder without the key loads with
``s = 1``, exactly speculators' computation. Saving is ``state_dict`` minus the tied embedding
(``include_embeddings=True`` keeps it); loading refuses, naming the key, what SPADE's head lacks: a non-Llama layer
config (e.g. speculators' Qwen3 default, q/k norms), more than one decoder layer, ``norm_before_fc`` / ``fc_norm``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from spade_lib.decoding.drafts.eagle import LAYER_KEYS, EagleConfig, EagleHead, default_feature_layers
from spade_lib.decoding.model.heads import check_head_state
from spade_lib.io import write_json
from spade_lib.validate import ArgumentTypeError, check_bool, check_dtype, check_float, check_int

__all__ = ["SPECULATORS_VERSION", "is_speculators_folder", "save_speculators", "load_speculators"]

SPECULATORS_VERSION = "0.9.0"  # the version whose format this module writes (and its tests load)
WEIGHTS = "model.safetensors"
_IGNORED = ("verifier_lm_head.weight", "verifier_norm.weight")  # training-only tensors speculators never saves


def _read_config(folder: Path) -> dict:
    file = folder / "config.json"
    if not folder.is_dir():
        raise FileNotFoundError(f"folder: {folder} is not a folder (a head folder holds config.json and {WEIGHTS})")
    if not file.is_file():
        raise FileNotFoundError(f"folder: {folder} has no config.json (a head folder holds config.json and {WEIGHTS}: "
                                "speculators' Eagle3DraftModel.save_pretrained or spade_lib.zoo.heads.save_head writes both)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise OSError(f"folder: cannot read {file}: {e}") from e
    except ValueError as e:
        raise ValueError(f"folder: {file} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"folder: {file} holds a JSON {type(config).__name__}, not an object of config fields")
    return config


def _check_config(config: dict, file: Path) -> None:
    """The fields :func:`load_speculators` reads, each of its type, before any is used: an error names the
    field and ``file`` (a missing ``draft_vocab_size`` or ``'abc'`` would otherwise fail far from its cause)."""
    def named(check, key, *args, **kwargs):
        try:
            return check(key, config_of(key), *args, **kwargs)
        except ArgumentTypeError as e:
            raise ArgumentTypeError(f"{e} (in {file})") from None
        except ValueError as e:
            raise ValueError(f"{e} (in {file})") from None

    def config_of(key):
        node = config
        for part in key.split("."):
            node = node[part]
        return node

    required = ("draft_vocab_size", "transformer_layer_config", "transformer_layer_config.vocab_size",
                "transformer_layer_config.hidden_size", "transformer_layer_config.num_attention_heads")
    for key in required:
        try:
            config_of(key)
        except KeyError:
            raise ValueError(f"{key}: {file} lacks it (a speculators EAGLE-3 config names it)") from None
        except TypeError:
            raise ArgumentTypeError(f"{key.rpartition('.')[0]}: must be an object of fields in {file}") from None
    if not isinstance(config["transformer_layer_config"], dict):
        raise ArgumentTypeError(f"transformer_layer_config: must be an object of fields in {file}, got "
                                f"{config['transformer_layer_config']!r}")
    for key in required[2:]:
        named(check_int, key, min=1)
    vocab = config["transformer_layer_config"]["vocab_size"]
    named(check_int, "draft_vocab_size", min=1, max=vocab)
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if layers is not None:
        if not isinstance(layers, list):
            raise ArgumentTypeError(f"eagle_aux_hidden_state_layer_ids: must be a list of layer indices in {file}, "
                                    f"got {layers!r}")
        for i in range(len(layers)):
            try:
                check_int(f"eagle_aux_hidden_state_layer_ids[{i}]", layers[i], min=0)
            except ValueError as e:
                raise type(e)(f"{e} (in {file})") from None
    if config.get("target_hidden_size") is not None:
        named(check_int, "target_hidden_size", min=1)
    for key in ("norm_before_residual", "norm_output"):
        if key in config:
            named(check_bool, key)
    if "embed_scale" in config:
        named(check_float, "embed_scale", min=0.0, min_open=True)


def is_speculators_folder(path) -> bool:
    """Whether ``path`` is a local folder whose ``config.json`` names a ``speculators_model_type``."""
    try:
        folder = Path(path).expanduser()
        return folder.is_dir() and "speculators_model_type" in _read_config(folder)
    except (OSError, TypeError, ValueError):
        return False


def _layer_config(head: EagleHead) -> dict:
    from transformers import LlamaConfig

    d = LlamaConfig(**{**head.config.layer, "num_hidden_layers": 1, "tie_word_embeddings": False}).to_dict()
    for key in ("architectures", "_name_or_path", "dtype", "torch_dtype", "output_attentions",
                "output_hidden_states", "return_dict", "chunk_size_feed_forward", "id2label", "label2id",
                "problem_type", "is_encoder_decoder", "tokenizer_class", "_attn_implementation_autoset"):
        d.pop(key, None)
    return d


def _verifier_architectures(head: EagleHead, verifier_name_or_path) -> list[str]:
    """The verifier's architectures: the head's record of its target (``from_target``), else the verifier
    folder's ``config.json``, else a Llama."""
    known = head.config.meta.get("verifier_architectures")
    if known:
        return list(known)
    if verifier_name_or_path is not None:
        try:
            found = _read_config(Path(verifier_name_or_path)).get("architectures")
        except (OSError, TypeError):
            found = None
        if found:
            return list(found)
    return ["LlamaForCausalLM"]


def save_speculators(head: EagleHead, folder, *, verifier_name_or_path: str | None = None,
                     verifier_architectures: tuple[str, ...] | None = None, speculative_tokens: int = 3,
                     include_embeddings: bool = False) -> Path:
    """Write ``head`` (an ``eagle3`` :class:`EagleHead`) as a speculators EAGLE-3 folder; returns it.

    ``verifier_name_or_path``: the target's hub id or folder (vLLM and speculators load the verifier's
    embedding and norms from it; ``None`` leaves it unset); ``verifier_architectures``: its classes (default:
    what the head was built on, :func:`_verifier_architectures`; ``["Gemma3ForCausalLM"]`` for Gemma-3);
    ``speculative_tokens``: the proposal length written to ``speculators_config``; ``include_embeddings``:
    also write ``embed_tokens.weight``. A head whose ``embed_scale`` is not 1 (a Gemma verifier) writes it as
    the extra key ``embed_scale`` (module docstring)."""
    from safetensors.torch import save_file

    if not isinstance(head, EagleHead):
        raise ValueError(f"head: expected an EagleHead, got {type(head).__name__}")
    c = head.config
    if c.variant != "eagle3":
        raise ValueError(f"head: only eagle3 heads have a speculators format, got variant {c.variant!r} "
                         "(it feeds its output back through fc)")
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) or speculative_tokens < 1:
        raise ValueError(f"speculative_tokens: must be an integer >= 1, got {speculative_tokens!r}")
    architectures = (_verifier_architectures(head, verifier_name_or_path) if verifier_architectures is None
                     else list(verifier_architectures))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = head.fc.weight.dtype
    import transformers

    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": int(c.draft_vocab_size),
        "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
        "norm_before_residual": bool(c.norm_before_residual),
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": bool(c.norm_output),
        "embed_requires_grad": False,
        "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False,
        "dtype": str(dtype).replace("torch.", ""),
        "transformer_layer_config": _layer_config(head),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": architectures},
        },
        "transformers_version": transformers.__version__,
    }
    if c.embed_scale != 1.0:
        config["embed_scale"] = c.embed_scale
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    if not include_embeddings:
        state.pop("embed_tokens.weight")
    if c.draft_vocab_size == c.vocab_size:  # speculators keeps no maps for the whole vocabulary
        if not torch.equal(state["d2t"], torch.zeros_like(state["d2t"])):
            raise ValueError("head: a whole-vocabulary head must map draft row j to target id j (d2t = 0)")
        state.pop("d2t")
        state.pop("t2d")
    write_json(folder / "config.json", config)
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    return folder


def _refuse(config: dict, folder: Path) -> None:
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise ValueError(f"folder: {folder} holds a speculators {kind!r} model; SPADE loads 'eagle3' ones")
    _check_config(config, folder / "config.json")
    for key in ("norm_before_fc", "fc_norm"):
        if config.get(key):
            raise NotImplementedError(f"{key}: {folder} sets {key}=true, which SPADE's EagleHead does not implement")
    tl = config.get("transformer_layer_config") or {}
    if tl.get("model_type") != "llama":
        raise NotImplementedError(f"transformer_layer_config.model_type: {folder} has {tl.get('model_type')!r} "
                                  "(speculators' default is qwen3); SPADE's EagleHead implements 'llama' layers")
    if check_int("transformer_layer_config.num_hidden_layers", tl.get("num_hidden_layers", 1)) != 1:
        raise NotImplementedError(f"transformer_layer_config.num_hidden_layers: {folder} has "
                                  f"{tl['num_hidden_layers']} draft layers; SPADE's EagleHead has one")


def load_speculators(folder, *, target=None, dtype: torch.dtype | None = None, device=None) -> EagleHead:
    """An :class:`EagleHead` from a speculators EAGLE-3 folder (module docstring), in eval mode.

    ``target`` (the verifier, optional): its embedding is tied to the head unless the folder carries a
    trained one (``embed_requires_grad``), its layer count checks (and, when the folder names none,
    resolves) ``eagle_aux_hidden_state_layer_ids``, and the head goes to its device and dtype.
    Without a target the folder must carry ``embed_tokens.weight``."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    if dtype is not None:
        check_dtype("dtype", dtype)
    folder = Path(os.fspath(folder)).expanduser()
    config = _read_config(folder)
    _refuse(config, folder)  # its kind, then every field it reads (_check_config), then what SPADE lacks
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"folder: {folder} has no {WEIGHTS} (the head's tensors)")
    tl = LlamaConfig(**{k: v for k, v in config["transformer_layer_config"].items() if k != "model_type"}).to_dict()
    layer = {k: tl[k] for k in LAYER_KEYS if k in tl and tl[k] is not None}
    n_target = None if target is None else int(target.config.get_text_config().num_hidden_layers)
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if not layers:
        if n_target is None:
            raise ValueError(f"target: {folder} names no eagle_aux_hidden_state_layer_ids; give the target to "
                             "resolve speculators' default [2, L // 2, L - 3]")
        layers = default_feature_layers(n_target)
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    head_config = EagleConfig(
        layer=layer, feature_layers=tuple(layers), draft_vocab_size=int(config["draft_vocab_size"]),
        variant="eagle3", target_hidden_size=config.get("target_hidden_size"),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_output=bool(config.get("norm_output", False)), target_layers=n_target,
        embed_scale=float(config.get("embed_scale", 1.0)),
        meta={"source": "speculators", "folder": str(folder), "speculators_version": config.get("speculators_version"),
              "verifier": verifier.get("name_or_path"), "verifier_architectures": verifier.get("architectures")})
    if target is not None:
        tv = int(target.get_input_embeddings().weight.shape[0])
        if tv != head_config.vocab_size:
            raise ValueError(f"target: vocabulary {tv} differs from the head's transformer_layer_config.vocab_size "
                             f"{head_config.vocab_size} ({folder})")
    state = load_file(str(weights))
    for key in _IGNORED:
        state.pop(key, None)
    head = EagleHead(head_config)
    expected = set(head.state_dict())
    unexpected = sorted(set(state) - expected)
    if unexpected:
        raise ValueError(f"folder: {folder / WEIGHTS} has tensors an EAGLE-3 head does not: {unexpected[:8]}")
    optional = {"embed_tokens.weight"} | ({"d2t", "t2d"} if head_config.draft_vocab_size == head_config.vocab_size
                                          else set())
    missing = sorted(expected - set(state) - optional)
    if missing:
        raise ValueError(f"folder: {folder / WEIGHTS} lacks {missing[:8]}")
    check_head_state(head, state, str(weights))  # shapes against the config, kinds, finite weights
    use_own = "embed_tokens.weight" in state and (target is None or config.get("embed_requires_grad"))
    if target is None and "embed_tokens.weight" not in state:
        raise ValueError(f"target: {folder} carries no embed_tokens.weight; give the target whose embedding it uses")
    if not use_own:
        state.pop("embed_tokens.weight", None)
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    missing, _ = head.load_state_dict(state, strict=False)
    if d2t is not None:
        head.set_vocab_maps(d2t, t2d)
    if target is not None:
        p = next(target.parameters())
        head = head.to(device=p.device if device is None else device, dtype=p.dtype if dtype is None else dtype)
        if not use_own:
            head.tie_embeddings(target.get_input_embeddings())
    elif device is not None or dtype is not None:
        head = head.to(device=device, dtype=dtype)
    return head.eval()
