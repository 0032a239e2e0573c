"""The pitfall mutants s01-s11 of the seed's pitfall table, and the sanity mutant.

Each record patches impl/transformer.py's source; the seed's section 5 names the pitfall and the
test that must kill it. Where impl's design differs from the seed's, the patch keeps the
pitfall's meaning (s10: impl's decode_step reads a KV cache instead of recomputing the prefix).
"""

from __future__ import annotations

from mutants.patch import Mutant, Patch

_ENC_LAYER_INIT = """        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg)
        self.linear1 = nn.Linear(cfg.d_model, cfg.d_ff)"""

_DEC_LAYER_INIT = """        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)"""

_CONTRACT_FUNCTIONS = (
    "label_smoothed_loss",
    "noam_rate",
    "make_optimizer",
    "fit",
    "translate",
    "save_transformer",
    "load_transformer",
)
_CONTRACT_METHODS = ("__init__", "forward", "encode", "decode", "init_state", "decode_step")

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        id="sanity",
        mutator="EveryFunctionRaises",
        pitfall="every contract function and method raises: proves each test can fail at all",
        killers=(),  # every test must kill it; the matrix checks that separately
        append=f"""
def _sanity_mutant_raises(*args, **kwargs):
    raise RuntimeError("sanity mutant: every contract function raises")


for _name in {_CONTRACT_FUNCTIONS!r}:
    globals()[_name] = _sanity_mutant_raises
for _name in {_CONTRACT_METHODS!r}:
    setattr(Transformer, _name, _sanity_mutant_raises)
""",
    ),
    Mutant(
        id="s01",
        required=True,
        mutator="PostLnAsPreLn",
        pitfall="post-LN written as pre-LN: every sublayer normalizes its input, x + F(LN(x))",
        killers=("test_golden_torch",),
        patches=(
            Patch(_ENC_LAYER_INIT, _ENC_LAYER_INIT.replace('cfg.norm == "pre"', "True")),
            Patch(_DEC_LAYER_INIT, _DEC_LAYER_INIT.replace('cfg.norm == "pre"', "True")),
        ),
    ),
    Mutant(
        id="s02",
        required=True,
        mutator="NoFinalLayerNorm",
        pitfall="pre-LN without the final LayerNorm: enc_norm and dec_norm exist but are skipped",
        killers=("test_golden_torch",),
        patches=(
            Patch(
                "            x = self.enc_norm(x)\n        return x",
                "            pass  # mutant s02: no final LayerNorm\n        return x",
            ),
            Patch(
                "            y = self.dec_norm(y)\n",
                "            pass  # mutant s02: no final LayerNorm\n",
            ),
        ),
    ),
    Mutant(
        id="s03",
        required=True,
        mutator="NoCausalMask",
        pitfall="no causal mask in the decoder: self-attention reads future target positions",
        killers=("test_decoder_is_causal",),
        patches=(
            Patch(
                "causal = torch.ones(T, T, dtype=torch.bool, device=y.device).tril()",
                "causal = torch.ones(T, T, dtype=torch.bool, device=y.device)",
            ),
        ),
    ),
    Mutant(
        id="s04",
        required=True,
        mutator="CrossAttentionReadsDecoder",
        pitfall="cross-attention reads the decoder (causally masked) instead of the encoder",
        killers=("test_decoder_reads_the_source",),
        patches=(
            Patch(
                "y = y + self._ca_block(self.norm2(y), memory, cross_mask)",
                "y = y + self._ca_block(self.norm2(y), self.norm2(y), self_mask)",
            ),
            Patch(
                "y = self.norm2(y + self._ca_block(y, memory, cross_mask))",
                "y = self.norm2(y + self._ca_block(y, y, self_mask))",
            ),
        ),
    ),
    Mutant(
        id="s05",
        required=True,
        mutator="EmbeddingNotScaled",
        pitfall="embeddings not multiplied by sqrt(d_model): x0 = E[ids] + PE",
        killers=("test_embeddings_scaled_and_tied",),
        patches=(
            Patch(
                "x = F.embedding(ids, table) * math.sqrt(self.cfg.d_model)  # [B, T, d]",
                "x = F.embedding(ids, table)  # [B, T, d]",
            ),
        ),
    ),
    Mutant(
        id="s06",
        required=True,
        mutator="SourcePaddingReadable",
        pitfall="source padding readable in cross-attention: no mask on the memory's keys",
        killers=("test_source_padding_is_never_read",),
        patches=(
            Patch(
                "cross_mask = src_mask[:, None, None, :]  # [B, 1, 1, S]: source padding",
                "cross_mask = None  # mutant s06: source padding readable",
            ),
            Patch(
                "step_cross_mask = state.src_mask[:, None, None, :]  # [B, 1, 1, S]",
                "step_cross_mask = None  # mutant s06: source padding readable",
            ),
        ),
    ),
    Mutant(
        id="s07",
        required=True,
        mutator="SmoothingCountsPad",
        pitfall="label smoothing counting pad targets: they add loss and count in the mean",
        killers=("test_hand_example_label_smoothing",),
        patches=(
            Patch(
                "return torch.where(real, per_target, torch.zeros_like(per_target)).sum() / n_real",
                "return per_target.mean()  # mutant s07: pad targets counted",
            ),
        ),
    ),
    Mutant(
        id="s08",
        required=True,
        mutator="NoamOffByOne",
        pitfall="Noam at n = s: the first update has rate 0 and the peak is one update late",
        killers=("test_hand_example_noam",),
        patches=(
            Patch(
                "n = step + 1  # the paper counts updates from 1",
                "n = step  # mutant s08: counts updates from 0",
            ),
            # n**-0.5 at n = 0 is +inf as in float arithmetic, so the rate is min(inf, 0) = 0
            Patch(
                "min(n**-0.5, n * warmup**-1.5)",
                "min(n**-0.5 if n else math.inf, n * warmup**-1.5)",
            ),
        ),
    ),
    Mutant(
        id="s09",
        mutator="OutputNotTied",
        pitfall="the output layer not tied: a separate out.weight even with tie_embeddings",
        killers=("test_embeddings_scaled_and_tied",),
        patches=(
            Patch(
                "self.out = None if cfg.tie_embeddings else "
                "nn.Linear(d, cfg.tgt_vocab, bias=False)",
                "self.out = nn.Linear(d, cfg.tgt_vocab, bias=False)  # mutant s09: never tied",
            ),
        ),
    ),
    Mutant(
        id="s10",
        mutator="DecodeStepFirstPosition",
        pitfall="decode_step computes the first position's logits (position 0) at every step",
        killers=("test_decode_step_equals_forward",),
        patches=(
            Patch(
                "y_t = self._embed(y_prev[:, None], self.tgt_table(), start=t)  # [B, 1, d]",
                "y_t = self._embed(y_prev[:, None], self.tgt_table(), start=0)  # mutant s10",
            ),
        ),
    ),
    Mutant(
        id="s11",
        mutator="TranslateKeepsEos",
        pitfall="translate keeping eos at the end of a finished output",
        killers=("test_translate_is_greedy_with_beam_one_and_drops_eos",),
        patches=(
            Patch(
                "return list(best[:-1]) if best[-1] == eos else list(best)",
                "return list(best)  # mutant s11: eos kept",
            ),
        ),
    ),
)

# Contract clauses beyond the seed's pitfall table (issue 12): laws that the seed's tests missed.
# Not the seed's rung R5, so none is required of a student's suite, and mutation-score, which
# scores the seed's pitfalls, leaves them out; the kill-rate matrix runs them.
_FF_DROPOUT = "return self.dropout(self.linear2(self.dropout(F.relu(self.linear1({x})))))"
_STEP_EMBED = """\
        y_t = self._embed(y_prev[:, None], self.tgt_table(), start=t)  # [B, 1, d]
"""
# c04 keeps the token prefix where the state's K/V caches belong (in the body of decode_step
# alone, so that call coverage can tell which tests reach it: a new field of DecodeState would
# change the module's skeleton, and every test would run it)
_C04_STEP = """\
        prefix = y_prev[:, None]  # mutant c04: decode re-runs the whole prefix, kept in self_kv
        if t > 0:
            prefix = torch.cat([state.self_kv[0][0], prefix], dim=1)
        ones = torch.ones_like(prefix, dtype=torch.bool)
        logits = self.decode(prefix, memory, state.src_mask, ones)[:, -1]
        return logits, DecodeState(t + 1, state.src_mask, ((prefix, prefix),), None)
"""
CLAUSE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        id="c01",
        required=False,
        mutator="AttentionDropoutFixedRate",
        pitfall="attention-weight dropout at a fixed rate of 0.1 that ignores cfg.dropout",
        killers=("test_dropout_at_every_site", "test_dropout_only_in_training"),
        patches=(
            Patch(
                "self.dropout = nn.Dropout(cfg.dropout)  # on the attention weights",
                "self.dropout = nn.Dropout(0.1)  # mutant c01: a fixed rate",
            ),
        ),
    ),
    Mutant(
        id="c02",
        required=False,
        mutator="NoFeedForwardDropout",
        pitfall="no dropout inside the feed-forward: linear2 reads relu(linear1(x)) undropped",
        killers=("test_dropout_at_every_site",),
        patches=tuple(
            Patch(
                _FF_DROPOUT.format(x=x),
                f"return self.dropout(self.linear2(F.relu(self.linear1({x}))))  # mutant c02",
            )
            for x in ("x", "y")
        ),
    ),
    Mutant(
        id="c03",
        required=False,
        mutator="NoAttentionWeightDropout",
        pitfall="no dropout on the attention weights (sublayer outputs still dropped)",
        killers=("test_dropout_at_every_site",),
        patches=(
            Patch(
                "weights = self.dropout(torch.softmax(scores, dim=-1))",
                "weights = torch.softmax(scores, dim=-1)  # mutant c03: weights not dropped",
            ),
        ),
    ),
    Mutant(
        id="c04",
        required=False,
        mutator="DecodeStepRecomputesPrefix",
        pitfall="decode_step re-runs decode on the whole prefix at every step: no KV cache",
        killers=("test_decode_step_reads_a_kv_cache",),
        patches=(Patch(_STEP_EMBED, _C04_STEP + _STEP_EMBED),),
    ),
)

MUTANTS += CLAUSE_MUTANTS

_BY_ID = {m.id: m for m in MUTANTS}
PITFALLS = tuple(m.id for m in MUTANTS if m.id.startswith("s") and m.id != "sanity")  # s01..s11
CLAUSES = tuple(m.id for m in CLAUSE_MUTANTS)  # c01 .. c04
REQUIRED = tuple(m.id for m in MUTANTS if m.required)  # s01 .. s08


def get(mutant_id: str) -> Mutant:
    """The mutant with this id, a published one or a generated one of the committed catalog
    (mutants.generated_catalog); a KeyError lists the published ids."""
    if mutant_id in _BY_ID:
        return _BY_ID[mutant_id]
    from mutants import generated_catalog

    generated = generated_catalog.by_id()
    if mutant_id in generated:
        return generated[mutant_id]
    raise KeyError(f"no mutant {mutant_id!r}; known: {sorted(_BY_ID)} and the generated ones")
