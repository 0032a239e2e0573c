"""Reading a model's parameters from any source, under any known naming scheme.

`read_state_dict(source, config)` turns a dict of arrays or tensors, a model object, a
.safetensors file or a save_transformer directory into Params. The naming scheme is detected from
the keys: each function in SCHEMES is asked in turn and the first that recognizes the keys reads
them (another scheme registers itself with @register_scheme). Layer counts, the norm placement
and the tying come from the keys unless the config states them; d_model, d_ff and the vocabulary
sizes come from the arrays' shapes; n_heads and ln_eps, which no array shows, from the config.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from oracle.params import ModelSpec, Params

Scheme = Callable[[dict[str, np.ndarray], Any], Params | None]
SCHEMES: list[Scheme] = []

ATTN = ("q_proj", "k_proj", "v_proj", "out_proj")
CONTRACT_MAX_LEN = 256  # TransformerConfig's default, used when the config does not say


class StateDictError(ValueError):
    """The keys do not form a model: `missing` and `unexpected` name them."""

    def __init__(self, scheme: str, missing: Iterable[str], unexpected: Iterable[str]):
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        parts = []
        if self.missing:
            parts.append(f"missing keys {self.missing}")
        if self.unexpected:
            parts.append(f"unexpected keys {self.unexpected}")
        super().__init__(f"state_dict in the {scheme} scheme: " + "; ".join(parts))


def register_scheme(scheme: Scheme) -> Scheme:
    """Add a naming scheme, asked before those registered earlier (use as a decorator)."""
    SCHEMES.insert(0, scheme)
    return scheme


def config_value(config: Any, name: str) -> Any:
    """config[name] for a mapping, config.name otherwise; None when absent (or no config)."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def _required(config: Any, name: str) -> Any:
    value = config_value(config, name)
    if value is None:
        raise ValueError(
            f"{name} is not recorded in a state_dict: pass config= with {name} "
            "(a TransformerConfig, or a dict with its fields)"
        )
    return value


def _as_float64(value: Any) -> np.ndarray:
    """One array as float64: torch tensors are detached and converted by torch, exactly."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().double().numpy()
    return np.array(value, dtype=np.float64)


# --- The contract's scheme and the common checks --------------------------------------------------


def contract_layout(
    keys: Iterable[str], config: Any, layer_re: str, pre_keys: tuple[str, str]
) -> tuple[int, int, str]:
    """(n_enc, n_dec, norm): from the config when it states them, else from the keys."""
    keys = list(keys)
    counts = []
    for stack in ("encoder", "decoder"):
        found = [int(m.group(1)) for k in keys if (m := re.match(layer_re.format(stack), k))]
        counts.append(max(found) + 1 if found else 0)
    n_enc = config_value(config, "n_enc")
    n_dec = config_value(config, "n_dec")
    norm = config_value(config, "norm")
    has_final = any(k.rsplit(".", 1)[0] in pre_keys for k in keys)
    return (
        counts[0] if n_enc is None else int(n_enc),
        counts[1] if n_dec is None else int(n_dec),
        ("pre" if has_final else "post") if norm is None else norm,
    )


def contract_tie(keys: set[str], config: Any) -> str:
    """'all', 'tgt_out' or 'none' (params.TIES): from the config when it says, else the keys."""
    tie = config_value(config, "tie_embeddings")
    if tie is None:
        if "tgt_emb.weight" not in keys:
            return "all"
        return "none" if "out.weight" in keys else "tgt_out"
    if not tie:
        return "none"
    src_v, tgt_v = config_value(config, "src_vocab"), config_value(config, "tgt_vocab")
    if src_v is None or tgt_v is None:  # vocabulary sizes unknown: the keys show the tying
        return "all" if "tgt_emb.weight" not in keys else "tgt_out"
    return "all" if src_v == tgt_v else "tgt_out"


def contract_keys(n_enc: int, n_dec: int, norm: str, tie: str) -> list[str]:
    """Every state_dict name of the contract for this layout, in the contract's order."""
    tables = {"all": ["src_emb.weight"], "tgt_out": ["src_emb.weight", "tgt_emb.weight"]}
    keys = tables.get(tie, ["src_emb.weight", "tgt_emb.weight", "out.weight"])
    pairs = [".weight", ".bias"]
    for i in range(n_enc):
        mods = [f"self_attn.{m}" for m in ATTN] + ["linear1", "linear2", "norm1", "norm2"]
        keys += [f"encoder.{i}.{m}{s}" for m in mods for s in pairs]
    for i in range(n_dec):
        mods = [f"{a}.{m}" for a in ("self_attn", "cross_attn") for m in ATTN]
        mods += ["linear1", "linear2", "norm1", "norm2", "norm3"]
        keys += [f"decoder.{i}.{m}{s}" for m in mods for s in pairs]
    if norm == "pre":
        keys += [f"{n}{s}" for n in ("enc_norm", "dec_norm") for s in pairs]
    return keys


def expected_shape(name: str, d: int, d_ff: int, src_vocab: int, tgt_vocab: int) -> tuple[int, ...]:
    """The contract's shape of parameter `name` (Linear weights are (out, in))."""
    if name == "src_emb.weight":
        return (src_vocab, d)
    if name in ("tgt_emb.weight", "out.weight"):
        return (tgt_vocab, d)
    if ".linear1." in name:
        return (d_ff, d) if name.endswith("weight") else (d_ff,)
    if ".linear2." in name:
        return (d, d_ff) if name.endswith("weight") else (d,)
    if "_proj." in name:
        return (d, d) if name.endswith("weight") else (d,)
    return (d,)  # LayerNorm gains and biases


def params_from_contract(
    arrays: dict[str, np.ndarray],
    config: Any,
    layout: tuple[int, int, str, str],
    scheme: str = "contract",
    source_name: Callable[[str], str] = lambda name: name,
) -> Params:
    """Params from float64 arrays under the contract's names (every one of contract_keys, put in
    its order), after checking every shape.

    `layout` is (n_enc, n_dec, norm, tie); `source_name` gives a key's name in the source's
    scheme for error messages.
    """
    n_enc, n_dec, norm, tie = layout
    arrays = {name: arrays[name] for name in contract_keys(n_enc, n_dec, norm, tie)}
    d = arrays["src_emb.weight"].shape[1]
    src_vocab = arrays["src_emb.weight"].shape[0]
    out = {"all": "src_emb.weight", "tgt_out": "tgt_emb.weight", "none": "out.weight"}[tie]
    tgt_vocab = arrays[out].shape[0]
    ff = next((k for k in arrays if k.endswith(".linear1.weight")), None)
    d_ff = arrays[ff].shape[0] if ff else int(config_value(config, "d_ff") or 0)
    stated = {"d_model": d, "src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "d_ff": d_ff}
    for field, value in stated.items():
        said = config_value(config, field)
        if said is not None and said != value:
            raise ValueError(f"config says {field}={said} but the arrays have {field}={value}")
    for name, a in arrays.items():
        want = expected_shape(name, d, d_ff, src_vocab, tgt_vocab)
        if a.shape != want:
            raise ValueError(f"{source_name(name)} has shape {a.shape}, expected {want}")
    spec = ModelSpec(
        d_model=d,
        n_heads=int(_required(config, "n_heads")),
        d_ff=d_ff,
        n_enc=n_enc,
        n_dec=n_dec,
        norm=norm,
        ln_eps=float(_required(config, "ln_eps")),
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        max_len=int(config_value(config, "max_len") or CONTRACT_MAX_LEN),
        tie=tie,
    )
    return Params(spec, arrays, scheme)


def _check_keys(scheme: str, have: Iterable[str], want: Iterable[str]) -> None:
    have, want = set(have), set(want)
    if have != want:
        raise StateDictError(scheme, want - have, have - want)


def read_contract(arrays: dict[str, np.ndarray], config: Any) -> Params | None:
    """The contract's names (CONTRACT.md, "state_dict names"): encoder.{i}.self_attn.q_proj..."""
    if "src_emb.weight" not in arrays or any(".layers." in k for k in arrays):
        return None
    n_enc, n_dec, norm = contract_layout(arrays, config, r"{}\.(\d+)\.", ("enc_norm", "dec_norm"))
    tie = contract_tie(set(arrays), config)
    _check_keys("contract", arrays, contract_keys(n_enc, n_dec, norm, tie))
    return params_from_contract(arrays, config, (n_enc, n_dec, norm, tie))


# --- torch's stacks: nn.TransformerEncoder/Decoder of batch_first layers --------------------------


def torch_name(name: str) -> tuple[str, int | None]:
    """A contract name's torch-stack name, and which third of a packed in_proj it is (q, k, v)."""
    if name == "enc_norm.weight" or name == "enc_norm.bias":
        return "encoder.norm." + name.split(".")[1], None
    if name == "dec_norm.weight" or name == "dec_norm.bias":
        return "decoder.norm." + name.split(".")[1], None
    m = re.match(r"(encoder|decoder)\.(\d+)\.(.*)$", name)
    if not m:
        return name, None  # the embedding and output tables keep the contract's names
    stack, i, rest = m.groups()
    rest = rest.replace("cross_attn.", "multihead_attn.")
    packed = re.match(r"(self_attn|multihead_attn)\.([qkv])_proj\.(weight|bias)$", rest)
    if packed:
        attn, which, kind = packed.groups()
        return f"{stack}.layers.{i}.{attn}.in_proj_{kind}", "qkv".index(which)
    return f"{stack}.layers.{i}.{rest}", None


def read_torch_stacks(arrays: dict[str, np.ndarray], config: Any) -> Params | None:
    """torch's names: encoder.layers.{i}.self_attn.in_proj_weight [3d, d] (q, k, v stacked),
    decoder.layers.{i}.multihead_attn.* (the cross-attention), encoder.norm / decoder.norm
    (pre-LN)."""
    if not any(re.match(r"(encoder|decoder)\.layers\.\d+\.", k) for k in arrays):
        return None
    n_enc, n_dec, norm = contract_layout(
        arrays, config, r"{}\.layers\.(\d+)\.", ("encoder.norm", "decoder.norm")
    )
    tie = contract_tie(set(arrays), config)
    names = contract_keys(n_enc, n_dec, norm, tie)
    _check_keys("torch-stack", arrays, {torch_name(n)[0] for n in names})
    d = arrays["src_emb.weight"].shape[-1]
    contract: dict[str, np.ndarray] = {}
    for name in names:
        source, third = torch_name(name)
        a = arrays[source]
        if third is not None:
            if a.shape[0] != 3 * d:
                raise ValueError(f"{source} has shape {a.shape}, expected {3 * d} rows (q, k, v)")
            a = a[third * d : (third + 1) * d].copy()
        contract[name] = a
    return params_from_contract(
        contract, config, (n_enc, n_dec, norm, tie), "torch-stack", lambda n: torch_name(n)[0]
    )


SCHEMES.extend([read_torch_stacks, read_contract])


# --- Sources --------------------------------------------------------------------------------------


def _load_path(path: Path) -> tuple[dict[str, Any], Any]:
    from safetensors.numpy import load_file

    if path.is_dir():
        config = json.loads((path / "config.json").read_text())
        return load_file(str(path / "model.safetensors")), config
    if path.suffix == ".safetensors":
        return load_file(str(path)), None
    raise ValueError(f"{path}: expected a .safetensors file or a save_transformer directory")


def read_state_dict(source: Any, config: Any = None) -> Params:
    """Params from a dict of arrays/tensors, a model (.state_dict() and .cfg or .config), a
    .safetensors file or a save_transformer directory (its config.json is the config).

    `config` (a TransformerConfig, or a dict with its fields) overrides the source's own.
    """
    own_config = None
    if isinstance(source, (str, os.PathLike)):
        source, own_config = _load_path(Path(source))
    elif hasattr(source, "state_dict") and callable(source.state_dict):
        own_config = getattr(source, "cfg", None) or getattr(source, "config", None)
        source = source.state_dict()
    if not isinstance(source, Mapping):
        raise TypeError(f"cannot read parameters from {type(source).__name__}")
    config = own_config if config is None else config
    arrays = {str(k): _as_float64(v) for k, v in source.items()}
    for scheme in SCHEMES:
        params = scheme(arrays, config)
        if params is not None:
            return params
    shown = sorted(arrays)[:8]
    raise ValueError(f"no known naming scheme recognizes these keys (first of them: {shown})")
