"""The faults students really write, as data: each planted by exact-text patches in two
independent correct implementations (impl/transformer.py and examples/correct_submission.py, so
the patch text differs per host), with what the grade must say of it: the place (the module the
diagnosis names first, or the test that owns the fault) and words of the cause's sentence.

tests/harness_tests/shared_tests/test_fault_causes.py plants each fault in both hosts and checks
both; results/grading/fault_causes.md records how many are named right.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mutants.patch import Mutant, Patch

ROOT = Path(__file__).resolve().parents[1]
# the two correct hosts: a name for each, the source file patched
HOSTS = {
    "impl": ROOT / "impl" / "transformer.py",
    "example": ROOT / "examples" / "correct_submission.py",
}
DIAGNOSIS = "the diagnosis"  # a fault the forward pass's diagnosis must name


@dataclass(frozen=True)
class StudentFault:
    """One fault: what the student wrote, where the grade must place it and the words its
    one-sentence cause must hold; `plants` maps each host to its patches (a Mutant each)."""

    id: str
    fault: str
    owner: str  # DIAGNOSIS, or the shared test whose message names the fault
    place: str  # the diagnosis's first divergence, or a word the owner's message places it by
    cause: str  # words of the cause's sentence
    plants: dict[str, Mutant]

    def source(self, host: str) -> str:
        return self.plants[host].apply(HOSTS[host].read_text())


def _fault(
    id: str,
    fault: str,
    place: str,
    cause: str,
    impl: tuple[Patch, ...],
    example: tuple[Patch, ...],
    owner: str = DIAGNOSIS,
    append: str = "",
) -> StudentFault:
    plants = {
        host: Mutant(
            id=f"{id} ({host})",
            mutator="StudentFault",
            pitfall=fault,
            killers=(),
            patches=patches,
            append=append,
            target=str(HOSTS[host].relative_to(ROOT).with_suffix("")).replace("/", "."),
        )
        for host, patches in (("impl", impl), ("example", example))
    }
    return StudentFault(id, fault, owner, place, cause, plants)


P = Patch

# impl's scores line and the example's: the attention's scaling is written here
_IMPL_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, h, T, S]"
_EX_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, h, T, S]"
_IMPL_MASK = 'scores = scores.masked_fill(~mask, float("-inf"))'
_EX_MASK = 'scores = scores.masked_fill(~allowed[:, None], float("-inf"))'

# a LayerNorm written by hand (keeping nn.LayerNorm's parameters and names), with a slip
_HAND_NORMS = '''

class WrongAxisNorm(nn.LayerNorm):
    """A hand-written LayerNorm that normalises over dim 1 (the positions)."""

    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = ((x - mean) ** 2).mean(1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class PlainNorm(nn.LayerNorm):
    """A hand-written LayerNorm that never applies its weight and bias."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps)
'''

_IMPL_ENC_NORMS = (
    "        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n"
    "        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n"
    "        self.dropout"
)
_IMPL_DEC_NORMS = "        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n"
_IMPL_DEC_NORMS_12 = (
    "        self.cross_attn = MultiHeadAttention(cfg)\n"
    "        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)\n"
    "        self.linear2 = nn.Linear(cfg.d_ff, cfg.d_model)\n"
    "        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n"
    "        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n"
)
_IMPL_TOP_NORMS = (
    "        self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None\n"
    "        self.dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None\n"
)
_EX_ENC_NORMS = "(nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) for _ in range(2))"
_EX_DEC_NORMS = "nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) for _ in range(3)"
_EX_TOP_NORMS = (
    "            self.enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps)\n"
    "            self.dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps)\n"
)


def _every_norm(cls: str) -> tuple[tuple[Patch, ...], tuple[Patch, ...]]:
    """Patches that build every LayerNorm of each host as `cls` (a hand-written one)."""
    impl = tuple(
        P(text, text.replace("nn.LayerNorm", cls))
        for text in (_IMPL_ENC_NORMS, _IMPL_DEC_NORMS_12, _IMPL_DEC_NORMS, _IMPL_TOP_NORMS)
    )
    example = tuple(
        P(text, text.replace("nn.LayerNorm", cls))
        for text in (_EX_ENC_NORMS, _EX_DEC_NORMS, _EX_TOP_NORMS)
    )
    return impl, example


FAULTS: tuple[StudentFault, ...] = (
    _fault(
        "no-scale",
        "attention scores not divided by sqrt(d_k)",
        "encoder.0.self_attn",
        "not divided by sqrt(d_k)",
        (P(_IMPL_SCORES, _IMPL_SCORES.replace(" / math.sqrt(self.d_k)", "")),),
        (P(_EX_SCORES, _EX_SCORES.replace(" / math.sqrt(q.shape[-1])", "")),),
    ),
    _fault(
        "scale-sqrt-d-model",
        "attention scores divided by sqrt(d_model)",
        "encoder.0.self_attn",
        "divided by sqrt(d_model)",
        (P(_IMPL_SCORES, _IMPL_SCORES.replace("self.d_k)", "self.n_heads * self.d_k)")),),
        (P(_EX_SCORES, _EX_SCORES.replace("q.shape[-1])", "self.q_proj.out_features)")),),
    ),
    _fault(
        "scale-d-k",
        "attention scores divided by d_k, not sqrt(d_k)",
        "encoder.0.self_attn",
        "divided by d_k",
        (P(_IMPL_SCORES, _IMPL_SCORES.replace("math.sqrt(self.d_k)", "self.d_k")),),
        (P(_EX_SCORES, _EX_SCORES.replace("math.sqrt(q.shape[-1])", "q.shape[-1]")),),
    ),
    _fault(
        "softmax-axis",
        "the attention's softmax over the queries (dim=-2), not the keys",
        "encoder.0.self_attn",
        "softmax",
        (P("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),),
        (P("scores.softmax(dim=-1)", "scores.softmax(dim=-2)"),),
    ),
    _fault(
        "split-heads",
        "heads split by view(B, h, T, d_k), not view(B, T, h, d_k).transpose(1, 2)",
        "encoder.0.self_attn",
        "heads are split",
        (
            P(
                "x.view(B, S, self.n_heads, self.d_k).transpose(1, 2)",
                "x.view(B, self.n_heads, S, self.d_k)",
            ),
        ),
        (P("x.view(B, L, h, d // h).transpose(1, 2)", "x.view(B, h, L, d // h)"),),
    ),
    _fault(
        "merge-heads",
        "heads merged by reshape(B, T, d) of [B, h, T, d_k], without transpose(1, 2)",
        "encoder.0.self_attn",
        "heads are merged",
        (P("heads.transpose(1, 2).reshape(B, T, C)", "heads.reshape(B, T, C)"),),
        (P("heads.transpose(1, 2).reshape(B, T, -1)", "heads.reshape(B, T, -1)"),),
    ),
    _fault(
        "mask-inverted",
        "the attention mask inverted: masked_fill(mask, -inf) where mask is True = readable",
        "encoder.0.self_attn",
        "mask is inverted",
        (P(_IMPL_MASK, _IMPL_MASK.replace("(~mask", "(mask")),),
        (P(_EX_MASK, _EX_MASK.replace("(~allowed", "(allowed")),),
    ),
    _fault(
        "mask-zero",
        "masked scores filled with 0 instead of -inf",
        "encoder.0.self_attn",
        "set to 0",
        (P(_IMPL_MASK, _IMPL_MASK.replace('float("-inf")', "0.0")),),
        (P(_EX_MASK, _EX_MASK.replace('float("-inf")', "0.0")),),
    ),
    _fault(
        "norm-axis",
        "a hand-written LayerNorm over dim 1 (the positions), not the features",
        "encoder.0.norm1",
        "over the positions",
        *_every_norm("WrongAxisNorm"),
        append=_HAND_NORMS,
    ),
    _fault(
        "norm-no-affine",
        "a hand-written LayerNorm that never applies its weight and bias",
        "encoder.0.norm1",
        "weight and bias",
        *_every_norm("PlainNorm"),
        append=_HAND_NORMS,
    ),
    _fault(
        "pre-ln-residual",
        "pre-LN with the residual taken after the norm: x = LN(x); x = x + F(x)",
        "encoder.0",
        "residual",
        (
            P(
                "            x = x + self._sa_block(self.norm1(x), mask)\n"
                "            x = x + self._ff_block(self.norm2(x))\n",
                "            x = self.norm1(x)\n"
                "            x = x + self._sa_block(x, mask)\n"
                "            x = self.norm2(x)\n"
                "            x = x + self._ff_block(x)\n",
            ),
            P(
                "            y = y + self._sa_block(self.norm1(y), self_mask)\n"
                "            y = y + self._ca_block(self.norm2(y), memory, cross_mask)\n"
                "            y = y + self._ff_block(self.norm3(y))\n",
                "            y = self.norm1(y)\n"
                "            y = y + self._sa_block(y, self_mask)\n"
                "            y = self.norm2(y)\n"
                "            y = y + self._ca_block(y, memory, cross_mask)\n"
                "            y = self.norm3(y)\n"
                "            y = y + self._ff_block(y)\n",
            ),
        ),
        (
            P(
                "            return x + self.drop(f(norm(x)))",
                "            x = norm(x)\n            return x + self.drop(f(x))",
            ),
        ),
    ),
    _fault(
        "no-final-norm",
        "pre-LN without the final LayerNorms (enc_norm, dec_norm built but never applied)",
        "decoder.0.cross_attn",
        "enc_norm is never applied",
        (
            P(
                "            x = self.enc_norm(x)\n        return x",
                "            pass\n        return x",
            ),
            P("            y = self.dec_norm(y)\n", "            pass\n"),
        ),
        (
            P('return self.enc_norm(x) if self.cfg.norm == "pre" else x', "return x"),
            P("            y = self.dec_norm(y)\n", "            pass\n"),
        ),
    ),
    _fault(
        "no-pe",
        "no positional encoding added",
        "x0 (source embeddings)",
        "no positional encoding",
        (
            P(
                "        x = x + positional_encoding(start, ids.size(1), self.cfg.d_model, "
                "x.dtype, x.device)\n",
                "",
            ),
        ),
        (P("return self.drop(x + sinusoids(positions, d).to(x.dtype))", "return self.drop(x)"),),
    ),
    _fault(
        "pe-scaled",
        "the positional encoding added before the sqrt(d_model) scaling: (E[ids] + PE) sqrt(d)",
        "x0 (source embeddings)",
        "scaled with",
        (
            P(
                "        x = F.embedding(ids, table) * math.sqrt(self.cfg.d_model)  # [B, T, d]\n"
                "        x = x + positional_encoding(start, ids.size(1), self.cfg.d_model, "
                "x.dtype, x.device)\n",
                "        x = F.embedding(ids, table)  # [B, T, d]\n"
                "        x = x + positional_encoding(start, ids.size(1), self.cfg.d_model, "
                "x.dtype, x.device)\n"
                "        x = x * math.sqrt(self.cfg.d_model)\n",
            ),
        ),
        (
            P(
                "        x = F.embedding(ids, table) * math.sqrt(d)\n",
                "        x = F.embedding(ids, table)\n",
            ),
            P(
                "return self.drop(x + sinusoids(positions, d).to(x.dtype))",
                "return self.drop((x + sinusoids(positions, d).to(x.dtype)) * math.sqrt(d))",
            ),
        ),
    ),
    _fault(
        "dropout-in-eval",
        "F.dropout on the attention weights without training=self.training: dropout in eval",
        "eval-mode",
        "dropout acts in eval mode",
        (
            P(
                "weights = self.dropout(torch.softmax(scores, dim=-1))",
                "weights = F.dropout(torch.softmax(scores, dim=-1), self.dropout.p)",
            ),
        ),
        (
            P(
                "heads = self.drop(scores.softmax(dim=-1)) @ v",
                "heads = F.dropout(scores.softmax(dim=-1), self.drop.p) @ v",
            ),
        ),
        owner="test_dropout_only_in_training",
    ),
    _fault(
        "noam-step",
        "noam_rate at update max(s, 1), not s + 1 (the contract counts steps from 0)",
        "noam_rate(step=",
        "s + 1",
        (P("    n = step + 1  # the paper counts updates from 1\n", "    n = max(step, 1)\n"),),
        (P("    n = step + 1\n", "    n = max(step, 1)\n"),),
        owner="test_hand_example_noam",
    ),
)

BY_ID = {f.id: f for f in FAULTS}
