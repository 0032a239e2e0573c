"""Single-fault variants of the real-world-style bases, with the verdicts the contract expects.

Each record:

- id: a short name; base: the base file (one of BASES) the patch applies to
- patch: exact [old, new] text replacements, applied in order to the base's source; each `old`
  occurs exactly once in the text it is applied to (run_set.variant_source checks)
- fault: what is wrong, in words
- expected:
  - failing: the exact set of shared tests that must fail, by CONTRACT.md's laws, one cause one
    charge: a test fails only if the fault breaks the law that test owns (not because today's
    grader happens to read the subject through a law the fault breaks)
  - dependent: tests whose method leans on a law this fault breaks (they judge against the
    oracle with the subject's names, or decode against a full-target forward pass); by the
    contract's laws they should pass, or fail only as a documented "not judged: <test> must pass
    first"; they are listed so a verdict check can tell an over-charge from a dependency
  - diagnosis: what the grader's explanation of the failing tests (their messages and the
    diagnosis) must contain, case-insensitively: every entry must appear; an entry is a
    substring, or a list of alternative substrings of which one must appear. They name the
    cause or the true first divergence (config names such as "ln_eps 1e-3" appear in every
    message, so no entry relies on words they contain)
  - absent (optional): substrings that must not appear: a false localization (a module whose
    output is a correct LN(x + attention) reported as the first divergence), or any
    "first divergence" where every value the contract defines agrees with the oracle
  - notes: why these tests, and what the fault does numerically where that matters

observed_today.json (written by `run_set.py --write-observed`) holds what the grader at the time
of writing actually failed, per id.
"""

from __future__ import annotations

LS = "test_hand_example_label_smoothing"
GOLDEN = "test_golden_torch"
CAUSAL = "test_decoder_is_causal"
PADDING = "test_source_padding_is_never_read"
READS_SOURCE = "test_decoder_reads_the_source"
STEP = "test_decode_step_equals_forward"
EMBEDDINGS = "test_embeddings_scaled_and_tied"
NAMES = "test_parameter_names_follow_the_norm"
TRANSLATE = "test_translate_is_greedy_with_beam_one_and_drops_eos"
BEAM = "test_beam_search_matches_oracle"
DROPOUT = "test_dropout_only_in_training"
LEARNS = "test_learns_reversed_addition"

# the bases, which must pass every shared test but those BASE_FAILING names
BASES = ("annotated.py", "fused.py", "nn_stacks.py", "functional.py", "onmt.py", "fairseq.py")

# onmt.py keeps OpenNMT-py's attribute names (linear_query, feed_forward.w_1, layer_norm_1, ...)
# and speaks the contract's names in its state_dict only (a state_dict hook renames the entries,
# which are the parameters themselves): gradients, hooked modules and parameters are matched to
# the contract's names by what the tensors are, not by named_parameters' spelling.
# fairseq.py keeps fairseq's names and its time-first (T x B x C) tensors inside the stacks, and
# an incremental state keyed by module for decode_step: hooked inputs are read batch-first.
#
# functional.py computes everything with torch.nn.functional from parameter-only modules that are
# never called. CONTRACT.md requires the contract's modules to be real submodules called in the
# forward pass (dropout at each site is observed at their inputs and outputs), so that one law
# cannot be judged on it, and fails as such; every value law still holds and is judged.
BASE_FAILING = {"functional.py": ["test_dropout_at_every_site"]}


VARIANTS: list[dict] = [
    # --- annotated.py: residual and LayerNorm inside the attention module ------------------------
    {
        "id": "annotated-pe-float32",
        "base": "annotated.py",
        "patch": [
            [
                "pe = torch.zeros(max_len, d_model, dtype=torch.float64)",
                "pe = torch.zeros(max_len, d_model)  # FAULT: a float32 table",
            ],
            [
                "position = torch.arange(0, max_len, dtype=torch.float64).unsqueeze(1)",
                "position = torch.arange(0, max_len).unsqueeze(1)",
            ],
            [
                "torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model)",
                "torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model)",
            ],
        ],
        "fault": "the positional table is computed in float32 (the notebook's code) and registered "
        "as a buffer; .double() casts the rounded values up, so PE is off by ~3e-8 in an "
        "otherwise float64 model",
        "expected": {
            "failing": [EMBEDDINGS, GOLDEN],
            "dependent": [],
            "diagnosis": ["positional", ["float32", "dtype"]],
            "notes": "x0 = E sqrt(d) + PE is wrong by float32 rounding (embedding law) and every "
            "value follows from it (values law). The diagnosis should name float32 rounding of "
            "the PE table and say to compute it in the parameters' dtype.",
        },
    },
    {
        "id": "annotated-pe-persistent",
        "base": "annotated.py",
        "patch": [
            [
                'self.register_buffer("pe", pe, persistent=False)',
                'self.register_buffer("pe", pe)  # FAULT: a persistent buffer',
            ],
        ],
        "fault": "the (correct, float64) positional table is a persistent buffer: pos.pe is in "
        "the state_dict",
        "expected": {
            "failing": [NAMES],
            "dependent": [],
            "diagnosis": ["persistent"],
            "absent": ["first divergence"],
            "notes": "only the names law (no persistent buffers) is broken; every value is right. "
            "Tests that read or load the state_dict must ignore buffers (today the decoding tests "
            "load parent-drawn noise into pos.pe). The fix to suggest: persistent=False.",
        },
    },
    {
        "id": "annotated-ln-unbiased",
        "base": "annotated.py",
        "patch": [
            [
                "var = x.var(-1, keepdim=True, unbiased=False)",
                "std = x.std(-1, keepdim=True)  # FAULT: unbiased, and eps outside the sqrt",
            ],
            [
                "return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias",
                "return self.weight * (x - mean) / (std + self.eps) + self.bias",
            ],
        ],
        "fault": "the hand-written LayerNorm of the notebook: unbiased std (n - 1) and eps added "
        "to the std instead of inside the square root",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [TRANSLATE, BEAM],
            "diagnosis": [["variance", "unbiased"]],
            "notes": "LN outputs scale by sqrt((d-1)/d) (3% at d=16): a values fault only. The "
            "embedding law (x0) holds; a check of x0 through a LayerNorm must not charge it. The "
            "decoding tests compare with the oracle's greedy/beam output on the subject's "
            "weights, so they may be listed as dependents.",
        },
    },
    {
        "id": "annotated-norm2-eps-default",
        "base": "annotated.py",
        "patch": [
            [
                "so the state_dict keeps the contract's names.\n",
                "so the state_dict keeps the contract's names.\n\n"
                "examples/annotated_submission.py: this layout is correct; the one fault, marked\n"
                "FAULT below, is further on: the encoder layers' norm2 does not get cfg.ln_eps.\n",
            ],
            [
                "self.norm2 = LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n        self.dropout",
                "self.norm2 = LayerNorm(cfg.d_model)  # FAULT: cfg.ln_eps not passed (1e-6)\n"
                "        self.dropout",
            ],
        ],
        "fault": "residual and LayerNorm inside the attention module (a correct layout) plus one "
        "fault further on: the encoder layers' norm2 is built without cfg.ln_eps, so it uses "
        "the class default 1e-6",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": ["encoder.0.norm2"],
            "absent": ["first divergence: encoder.0.self_attn"],
            "notes": "encoder.{i}.self_attn returns LN(x + attention): it must not be reported "
            "as diverging. The first departure is encoder.0.norm2 (eps 1e-6 instead of 1e-5, "
            "or of 1e-3 in the golden pre-LN config; the post-LN logits move by 1.2e-5). Also "
            "examples/annotated_submission.py.",
        },
    },
    {
        "id": "annotated-ffn-gelu",
        "base": "annotated.py",
        "patch": [
            [
                "return layer.linear2(layer.dropout(F.relu(layer.linear1(x))))",
                "return layer.linear2(layer.dropout(F.gelu(layer.linear1(x))))  # FAULT: gelu",
            ],
        ],
        "fault": "residual and LayerNorm inside the attention module, plus the feed-forward's "
        "activation gelu instead of relu",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [TRANSLATE, BEAM],
            "diagnosis": ["encoder.0.linear2"],
            "absent": ["first divergence: encoder.0.self_attn"],
            "notes": "the first module whose output departs is encoder.0.linear2 (linear1 is "
            "exact); self_attn's LN(x + attention) must not be reported.",
        },
    },
    {
        "id": "annotated-log-softmax",
        "base": "annotated.py",
        "patch": [
            [
                "        return F.linear(x, weight)",
                "        return F.log_softmax(F.linear(x, weight), dim=-1)  # FAULT: log-probs",
            ],
        ],
        "fault": "the Generator's log_softmax kept: forward returns log-probabilities, not logits",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": [["log-probabilit", "log probabilit", "log_softmax", "log-softmax"]],
            "absent": ["first divergence: encoder", "first divergence: decoder"],
            "notes": "the logits differ from the oracle's by a constant per position (the log "
            "partition function); the smoothed loss and every gradient are exact, decoding is "
            "unchanged (log_softmax is idempotent). Only the values law (logits) is broken; the "
            "embedding law is not, even if it is checked through logits.",
        },
    },
    # --- fused.py: fused q/k/v, torch's module layout, einsum attention -------------------------
    {
        "id": "fused-pe-float32",
        "base": "fused.py",
        "patch": [
            [
                "pos = torch.arange(length, dtype=torch.float64)",
                "pos = torch.arange(length, dtype=torch.float)  # FAULT: float32",
            ],
            [
                "freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)",
                "freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float) / d)",
            ],
        ],
        "fault": "the positional table is computed in float32 at every call "
        "(torch.arange(..., dtype=torch.float)), then cast to the model's float64",
        "expected": {
            "failing": [EMBEDDINGS, GOLDEN],
            "dependent": [],
            "diagnosis": ["positional", ["float32", "dtype"]],
            "notes": "as annotated-pe-float32, without a buffer.",
        },
    },
    {
        "id": "fused-out-bias",
        "base": "fused.py",
        "patch": [
            [
                "nn.Linear(d, cfg.tgt_vocab, bias=False)",
                "nn.Linear(d, cfg.tgt_vocab)  # FAULT: the output layer has a bias",
            ],
        ],
        "fault": "the untied output layer has a bias (out.bias), used in the logits",
        "expected": {
            "failing": [NAMES],
            "dependent": [GOLDEN, BEAM],
            "diagnosis": ["out.bias"],
            "notes": "one cause, one charge: the names law (no out.bias) is broken. Read as part "
            "of the output layer, the bias explains the logits, so no values test is charged; a "
            "grader that cannot read it says 'not judged' for the untied configurations.",
        },
    },
    {
        "id": "fused-loss-sum",
        "base": "fused.py",
        "patch": [
            [
                "return ((1 - eps) * nll + eps * smooth).mean()",
                "return ((1 - eps) * nll + eps * smooth).sum()  # FAULT: a sum",
            ],
        ],
        "fault": "label_smoothed_loss sums over the real targets instead of taking their mean",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": ["sum"],
            "absent": ["first divergence"],
            "notes": "the golden loss and every gradient are the oracle's times the count of real "
            "targets (14 in the golden batches). The hand example has a single real target, "
            "where a sum equals the mean, so it passes; Adam is scale-invariant, so learning and "
            "fit pass.",
        },
    },
    {
        "id": "fused-pre-ln-placement",
        "base": "fused.py",
        "patch": [
            [
                'self.norm_first = cfg.norm == "pre"\n'
                "        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)\n"
                "        self.linear1",
                "self.norm_first = False  # FAULT: post-LN residuals even when norm='pre'\n"
                "        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)\n"
                "        self.linear1",
            ],
            [
                'self.norm_first = cfg.norm == "pre"\n'
                "        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)\n"
                "        self.multihead_attn",
                "self.norm_first = False\n"
                "        self.self_attn = FusedAttention(cfg.d_model, cfg.n_heads, cfg.dropout)\n"
                "        self.multihead_attn",
            ],
        ],
        "fault": "with norm='pre' every layer still computes LN(x + F(x)) (post-LN placement); "
        "the final enc_norm/dec_norm are there, so the names are right",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [BEAM],
            "diagnosis": ["placement"],
            "notes": "only the pre-LN golden configuration differs. The embeddings are exact; a "
            "check of x0 through a zeroed pre-LN model sees LN(LN(x0)) here and must not charge "
            "the embedding law. The beam test runs pre-LN against the oracle: a dependent.",
        },
    },
    {
        "id": "fused-no-sqrt-d",
        "base": "fused.py",
        "patch": [
            [
                "x = table[ids] * math.sqrt(d)",
                "x = table[ids]  # FAULT: not scaled by sqrt(d_model)",
            ],
        ],
        "fault": "the embeddings are not multiplied by sqrt(d_model)",
        "expected": {
            "failing": [EMBEDDINGS, GOLDEN],
            "dependent": [TRANSLATE, BEAM, LEARNS],
            "diagnosis": ["sqrt"],
            "notes": "x0 is wrong (embedding law) and every value follows (values law). The "
            "learning is genuinely worse (held-out loss 1.93 against the bar 0.84 when written): "
            "an outcome of the same fault, listed as a dependent.",
        },
    },
    {
        "id": "fused-causal-off-by-one",
        "base": "fused.py",
        "patch": [
            [
                "dtype=torch.bool, device=tgt_in.device), diagonal=0)",
                "dtype=torch.bool, device=tgt_in.device), diagonal=1)  # FAULT",
            ],
        ],
        "fault": "the causal mask is off by one: position t also reads position t + 1",
        "expected": {
            "failing": [CAUSAL, GOLDEN],
            "dependent": [STEP, LEARNS],
            "diagnosis": ["decoder.0.self_attn"],
            "notes": "decode reads the next target; decode_step cannot (its cache holds only the "
            "prefix), so it equals decode on the same prefix as the contract states, and "
            "translate is unchanged. The decode_step test compares with decode on the whole "
            "target, which equals the prefix's only for a causal decoder: a dependent. Trained "
            "with a peek at the next token, the model fails the learning test's causal held-out "
            "evaluation (3.09 against 0.84 when written): an outcome of the same fault.",
        },
    },
    # --- nn_stacks.py: nn.TransformerEncoder/Decoder, names translated by hooks -----------------
    {
        "id": "nn_stacks-pe-float32",
        "base": "nn_stacks.py",
        "patch": [
            [
                "on the new position only.\n",
                "on the new position only.\n\n"
                "examples/float32_pe_submission.py: one fault, marked FAULT below: the\n"
                "positional table is computed in float32 as in the tutorial, though the model\n"
                "runs in float64.\n",
            ],
            [
                "-torch.arange(0, emb_size, 2, dtype=torch.float64) * math.log(10000) / emb_size",
                "-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size",
            ],
            [
                "pos = torch.arange(0, maxlen, dtype=torch.float64).reshape(maxlen, 1)",
                "pos = torch.arange(0, maxlen).reshape(maxlen, 1)",
            ],
            [
                "pos_embedding = torch.zeros((maxlen, emb_size), dtype=torch.float64)",
                "pos_embedding = torch.zeros((maxlen, emb_size))  # FAULT: a float32 table",
            ],
        ],
        "fault": "the tutorial's PositionalEncoding as written there: a float32 table in a "
        "(non-persistent) buffer, cast up by .double()",
        "expected": {
            "failing": [EMBEDDINGS, GOLDEN],
            "dependent": [],
            "diagnosis": ["positional", ["float32", "dtype"]],
            "notes": "as annotated-pe-float32. Also examples/float32_pe_submission.py.",
        },
    },
    {
        "id": "nn_stacks-final-norms-post",
        "base": "nn_stacks.py",
        "patch": [
            [
                "enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
                "enc_norm = nn.LayerNorm(d, eps=cfg.ln_eps)  # FAULT: as nn.Transformer does",
            ],
            [
                "dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
                "dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps)",
            ],
        ],
        "fault": "nn.Transformer's automatic final norms kept in post-LN: encoder.norm and "
        "decoder.norm exist and run in both placements",
        "expected": {
            "failing": [NAMES, GOLDEN],
            "dependent": [TRANSLATE, LEARNS],
            "diagnosis": ["enc_norm", ["norm=none", "final norm", "automatic"]],
            "notes": "post-LN lists enc_norm/dec_norm (names law) and applies an extra LN after "
            "each stack (values law). Pre-LN is exact. The translate and learning tests read "
            "the weights by name in post-LN: dependents. The fix to suggest: norm=None in "
            "post-LN.",
        },
    },
    {
        "id": "nn_stacks-transformer-prefix",
        "base": "nn_stacks.py",
        "patch": [
            ["class Transformer(nn.Module):", "class Seq2SeqTransformer(nn.Module):"],
            [
                "\n\ndef layer_step(",
                '''

class Transformer(nn.Module):
    """The course's entry point: wraps the model (FAULT: every name gets a transformer. prefix)."""

    def __init__(self, cfg):
        super().__init__()
        self.transformer = Seq2SeqTransformer(cfg)
        self.cfg = cfg

    def forward(self, src, tgt_in, src_mask, tgt_mask):
        return self.transformer(src, tgt_in, src_mask, tgt_mask)

    def encode(self, src, src_mask):
        return self.transformer.encode(src, src_mask)

    def decode(self, tgt_in, memory, src_mask, tgt_mask):
        return self.transformer.decode(tgt_in, memory, src_mask, tgt_mask)

    def init_state(self, src_mask):
        return self.transformer.init_state(src_mask)

    def decode_step(self, y_prev, memory, state):
        return self.transformer.decode_step(y_prev, memory, state)


def layer_step(''',
            ],
        ],
        "fault": "a wrapper module holds the real model as self.transformer: every state_dict "
        "name has a transformer. prefix",
        "expected": {
            "failing": [NAMES],
            "dependent": [],
            "diagnosis": ["transformer.", ["prefix", "wrapper"]],
            "absent": ["first divergence"],
            "notes": "only the names law is broken: under the prefix every name and value is the "
            "contract's. The fix to suggest: drop the wrapper (or its prefix).",
        },
    },
    {
        "id": "nn_stacks-dec-norm-eps",
        "base": "nn_stacks.py",
        "patch": [
            [
                "dec_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if pre else None",
                "dec_norm = nn.LayerNorm(d) if pre else None  # FAULT: torch's default eps",
            ],
        ],
        "fault": "the pre-LN final decoder norm is built without cfg.ln_eps (torch's 1e-5)",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": ["dec_norm"],
            "notes": "only the golden pre-LN configuration (ln_eps 1e-3) sees it; everything "
            "before dec_norm is exact.",
        },
    },
    {
        "id": "nn_stacks-src-padding-unmasked",
        "base": "nn_stacks.py",
        "patch": [
            [
                "return self.encoder(self.embed(src, self.src_emb.weight), "
                "src_key_padding_mask=~src_mask)",
                "return self.encoder(self.embed(src, self.src_emb.weight))  # FAULT: no mask",
            ],
        ],
        "fault": "the encoder's self-attention does not mask source padding",
        "expected": {
            "failing": [GOLDEN, PADDING],
            "dependent": [TRANSLATE, BEAM],
            "diagnosis": ["encoder.0.self_attn"],
            "notes": "padded source positions are read by the encoder (padding law) and the "
            "golden batches have padded sources (values law). The decoding tests encode padded "
            "sources and compare with the oracle: dependents.",
        },
    },
    # --- onmt.py: OpenNMT-py's attribute names, the contract's names in the state_dict only ---
    {
        "id": "onmt-layers-shared",
        "base": "onmt.py",
        "patch": [
            [
                "nn.ModuleList([TransformerEncoderLayer(cfg) for _ in range(cfg.n_enc)])",
                "nn.ModuleList([TransformerEncoderLayer(cfg)] * cfg.n_enc)  # FAULT: one layer",
            ],
            [
                "[TransformerDecoderLayer(cfg) for _ in range(cfg.n_dec)]",
                "[TransformerDecoderLayer(cfg)] * cfg.n_dec",
            ],
        ],
        "fault": "nn.ModuleList([layer] * n): every layer of a stack is one module, so all of "
        "them share the first layer's weights",
        "expected": {
            "failing": [NAMES],
            "dependent": [],
            "diagnosis": ["one tensor", "[layer] * n"],
            "absent": ["first divergence", "not judged"],
            "notes": "CONTRACT.md: each state_dict name is a tensor of its own. The names are "
            "right but encoder.1.* is encoder.0.*: only the names law is broken. On weights the "
            "parent pushes (one value per tensor) every value is the oracle's for identical "
            "layers, and each shared tensor's gradient is the sum of the oracle's gradients of "
            "its names; this base's save_transformer clones every tensor, so save/load works.",
        },
    },
    {
        "id": "onmt-layers-shared-saved-as-is",
        "base": "onmt.py",
        "patch": [
            [
                "nn.ModuleList([TransformerEncoderLayer(cfg) for _ in range(cfg.n_enc)])",
                "nn.ModuleList([TransformerEncoderLayer(cfg)] * cfg.n_enc)  # FAULT: one layer",
            ],
            [
                "[TransformerDecoderLayer(cfg) for _ in range(cfg.n_dec)]",
                "[TransformerDecoderLayer(cfg)] * cfg.n_dec",
            ],
            [
                "    tensors = {k: v.detach().clone().contiguous() for k, v in "
                "model.state_dict().items()}\n",
                "    tensors = model.state_dict()\n",
            ],
        ],
        "fault": "nn.ModuleList([layer] * n) in both stacks, and save_transformer hands the "
        "state_dict to safetensors as it is: it refuses tensors that share memory",
        "expected": {
            "failing": [NAMES],
            "dependent": [TRANSLATE],
            "diagnosis": ["one tensor", "[layer] * n"],
            "absent": ["first divergence"],
            "notes": "as onmt-layers-shared (the names law: each name a tensor of its own); "
            "save_transformer raises for two or more layers, an outcome of the same fault that "
            "the save/load test meets (a model the contract forbids): a dependent. (A fairseq "
            "style keyed its incremental state by attention module, so one module for every "
            "layer also broke decode_step there: this base keeps a cache per layer index.)",
        },
    },
    {
        "id": "onmt-load-drops-norm",
        "base": "onmt.py",
        "patch": [
            [
                "        cfg = TransformerConfig(**json.load(f))",
                "        saved = json.load(f)\n"
                '        saved.pop("norm")  # FAULT: the placement is not restored\n'
                "        cfg = TransformerConfig(**saved)",
            ],
            [
                "    model.load_state_dict(tensors)\n    return model",
                "    model.load_state_dict(tensors, strict=False)\n    return model",
            ],
        ],
        "fault": "load_transformer drops the config's norm (the model comes back post-LN) and "
        "loads non-strictly, so a pre-LN model loses its placement and its final norms",
        "expected": {
            "failing": [TRANSLATE],
            "dependent": [],
            "diagnosis": ["pre-LN", "load_transformer"],
            "absent": ["first divergence"],
            "notes": "post-LN round trips exactly; the pre-LN one does not. The save/load law is "
            "the translate test's, which runs save/load at 2+2 layers in both norms; no other "
            "test loads a saved model.",
        },
    },
    {
        "id": "onmt-norm1-eps-default",
        "base": "onmt.py",
        "patch": [
            [
                "self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)\n",
                "self.layer_norm = nn.LayerNorm(cfg.d_model)  # FAULT: cfg.ln_eps not passed\n",
            ],
        ],
        "fault": "the encoder layers' first norm (OpenNMT's layer_norm, the contract's norm1) is "
        "built without cfg.ln_eps (torch's 1e-5)",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": ["encoder.0.norm1"],
            "absent": ["must pass first", "cross_attn's input"],
            "notes": "only the golden pre-LN configuration (ln_eps 1e-3) sees it. The module is "
            "found by what its parameters are (OpenNMT's attribute names, the contract's only in "
            "the state_dict), so the diagnosis can name it. OpenNMT calls its attention as "
            "(key, value, query): the hooks record the query as the input shaped as the output, "
            "the memory as the one given twice (hooks.query_first), so every boundary is judged "
            "and none is said 'not judged'.",
        },
    },
    # --- fairseq.py: fairseq's names, time-first stacks, an incremental state ----------------
    {
        "id": "fairseq-no-sqrt-d",
        "base": "fairseq.py",
        "patch": [
            [
                "x = self.embed_scale * self.embed_tokens(src_tokens)",
                "x = self.embed_tokens(src_tokens)  # FAULT: not scaled by sqrt(d_model)",
            ],
        ],
        "fault": "the source embeddings are not multiplied by sqrt(d_model) (the target's are)",
        "expected": {
            "failing": [EMBEDDINGS, GOLDEN],
            "dependent": [TRANSLATE, BEAM, LEARNS],
            "diagnosis": ["sqrt", "time-first"],
            "notes": "x0 is wrong (embedding law), read at encoder.0's input, which is time-first "
            "[T, B, d] here: it is judged in the contract's layout and its cause named; every "
            "value follows (values law). Decoding and learning are outcomes of the same fault.",
        },
    },
    # --- fused.py, again: a parameter the contract does not have -----------------------------
    {
        "id": "fused-unused-parameter",
        "base": "fused.py",
        "patch": [
            [
                "        self.drop = nn.Dropout(cfg.dropout)\n",
                "        self.drop = nn.Dropout(cfg.dropout)\n"
                "        self.length_bias = nn.Parameter(torch.zeros(cfg.max_len))"
                "  # FAULT: unused\n",
            ],
        ],
        "fault": "a parameter the contract does not have (length_bias, never used) is in the "
        "state_dict",
        "expected": {
            "failing": [NAMES],
            "dependent": [],
            "diagnosis": ["length_bias"],
            "absent": ["not judged", "first divergence"],
            "notes": "only the names law is broken. Every name the contract has is there, so the "
            "value tests read the model without the extra one and judge it (the values are "
            "right).",
        },
    },
    # --- functional.py: parameter-only modules, torch.nn.functional, no hookable module outputs --
    {
        "id": "functional-enc-norm-eps",
        "base": "functional.py",
        "patch": [
            [
                "x = layer_norm(self.enc_norm, x, self.cfg.ln_eps)",
                "x = layer_norm(self.enc_norm, x, 1e-5)  # FAULT: torch's default, not cfg.ln_eps",
            ],
        ],
        "fault": "the pre-LN final encoder norm uses a hard-coded eps 1e-5 instead of cfg.ln_eps",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [],
            "diagnosis": ["enc_norm"],
            "notes": "only the golden pre-LN configuration (ln_eps 1e-3) sees it. No module of "
            "this style runs its own forward, so module hooks see nothing: naming enc_norm needs "
            "another probe (e.g. encode's output, or the residual stream at the stack's end).",
        },
    },
    {
        "id": "functional-dropout-in-eval",
        "base": "functional.py",
        "patch": [
            [
                "return F.dropout(x, self.cfg.dropout, self.training)",
                "return F.dropout(x, self.cfg.dropout)  # FAULT: F.dropout defaults to training",
            ],
        ],
        "fault": "the embedding dropout is F.dropout(x, p) without training=: it drops out in "
        "eval mode too (F.dropout's default is training=True)",
        "expected": {
            "failing": [DROPOUT],
            "dependent": [GOLDEN, CAUSAL, PADDING, READS_SOURCE, STEP, EMBEDDINGS, TRANSLATE, BEAM],
            "diagnosis": ["eval"],
            "notes": "one cause: dropout acts in eval mode, which the dropout test owns. Every "
            "other test of eval-mode values sees random logits and cannot judge its own law. "
            "The value tests (golden, embeddings) then say 'not judged: "
            "test_dropout_only_in_training must pass first' (values.eval_is_one_function); the "
            "law and decoding tests still fail with value messages (their families' to settle). "
            "Training (fit, learning) is unaffected.",
        },
    },
]

# --- the diagnosis on time-first stacks, a final norm missing, decode_step's rows (issue 24) ----
VARIANTS += [
    {
        "id": "fairseq-ffn-gelu",
        "base": "fairseq.py",
        "patch": [
            [
                "            x = self.final_layer_norm(x)\n"
                "        x = self.fc2(self.activation_dropout_module(F.relu(self.fc1(x))))",
                "            x = self.final_layer_norm(x)\n"
                "        x = self.fc2(self.activation_dropout_module(\n"
                "            F.gelu(self.fc1(x))))  # FAULT: gelu",
            ],
        ],
        "fault": "the encoder layers' feed-forward activation is gelu, not relu, inside "
        "fairseq's time-first ([T, B, C]) stack",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [TRANSLATE, BEAM],
            "diagnosis": ["encoder.0.linear2", "gelu", "time-first"],
            "absent": ["no diagnosis", "broadcast", "first divergence: x0", "not judged: shape"],
            "notes": "every hooked value inside the stacks is [T, B, C]; judged in the contract's "
            "layout, the first departure is encoder.0.linear2 (fc2), its input gelu(fc1(x)). "
            "Before issue 24 the diagnosis met the oracle's [B, ...] masks with a [T, B, C] "
            "value and crashed with a broadcast error. The decoding tests compare with the "
            "oracle's search: dependents.",
        },
    },
    {
        "id": "fairseq-no-enc-norm",
        "base": "fairseq.py",
        "patch": [
            [
                "        if self.layer_norm is not None:\n"
                "            x = self.layer_norm(x)\n"
                "        return x  # T x B x C",
                "        return x  # T x B x C  (FAULT: the final layer_norm never runs)",
            ],
        ],
        "fault": "pre-LN: the encoder's final layer_norm (enc_norm) exists but is never applied: "
        "the decoder reads the last encoder layer's un-normalised output",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [BEAM],
            "diagnosis": [
                "decoder.0.cross_attn",
                "enc_norm is never applied: the decoder reads the encoder's last layer "
                "un-normalised",
            ],
            "absent": ["first divergence: logits", "no diagnosis"],
            "notes": "only the golden pre-LN configuration sees it; every module computes the "
            "contract's function of its own input, and the memory the decoder reads is the last "
            "layer's output, not enc_norm's of it: the first reader, decoder.0.cross_attn, is the "
            "place (issue 24 saw 'first divergence: logits'). encode's output is not a contract "
            "boundary of the embeddings test (it reads encoder.0's input). The beam test decodes "
            "a pre-LN model against the oracle: a dependent.",
        },
    },
    {
        "id": "annotated-no-dec-norm",
        "base": "annotated.py",
        "patch": [
            [
                "    def generate(self, x):\n"
                '        if self.cfg.norm == "pre":\n'
                "            x = self.dec_norm(x)\n",
                "    def generate(self, x):  # FAULT: dec_norm is never applied\n",
            ],
        ],
        "fault": "pre-LN: the decoder's final norm (dec_norm) exists but is never applied: the "
        "output layer reads the last decoder layer's un-normalised output",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [BEAM],
            "diagnosis": [
                "first divergence: logits",
                "dec_norm is never applied: the output layer reads the decoder's last layer "
                "un-normalised",
            ],
            "absent": ["no diagnosis", "first divergence: decoder", "first divergence: encoder"],
            "notes": "only the golden pre-LN configuration sees it. Its output layer is the tied "
            "target table (F.linear, no module): the logits are the first reader, judged from "
            "the last decoder layer's hooked output. The beam test is pre-LN: a dependent.",
        },
    },
    {
        "id": "functional-no-enc-norm",
        "base": "functional.py",
        "patch": [
            [
                '        if self.cfg.norm == "pre":\n'
                "            x = layer_norm(self.enc_norm, x, self.cfg.ln_eps)\n"
                "        return x",
                "        return x  # FAULT: the pre-LN encoder's enc_norm is never applied",
            ],
        ],
        "fault": "pre-LN: enc_norm is never applied, in a style whose modules are never called "
        "(nothing hooked)",
        "expected": {
            "failing": [GOLDEN],
            "dependent": [BEAM],
            "diagnosis": [
                "enc_norm is never applied: the decoder reads the encoder's last layer "
                "un-normalised",
                "decoder.0.cross_attn",
            ],
            "absent": ["no diagnosis"],
            "notes": "as fairseq-no-enc-norm, without hooks: the whole-model hypothesis names the "
            "cause and its first reader. With no module called, the embeddings test reads x0 "
            "only through encode of a model whose sublayers output 0: here x0 itself, which the "
            "contract's x0 explains with no final norm, so x0 is judged right and the missing "
            "enc_norm is the golden test's alone (the embeddings test must pass; it charged "
            "the norm as an x0 fault before values.x0_behind_another_norm).",
        },
    },
    {
        "id": "annotated-y-prev-one-way",
        "base": "annotated.py",
        "patch": [
            [
                "if y_prev.dim() != 1 or y_prev.size(0) != state.src_mask.size(0):",
                "if y_prev.dim() != 1 or y_prev.size(0) > state.src_mask.size(0):  # FAULT",
            ],
        ],
        "fault": "decode_step checks y_prev's rows one way only: more rows than the state raise "
        "ValueError, fewer go on (and fail, or broadcast, further in)",
        "expected": {
            "failing": [STEP],
            "dependent": [],
            "diagnosis": ["y_prev of 2 rows for a state of 3 rows", "compared one way only"],
            "notes": "CONTRACT.md: y_prev not [B] for the state's B raises ValueError; the "
            "validation test tries more rows only, the decode_step test fewer (a decode_step "
            "that checks neither is the validation test's charge alone).",
        },
    },
    {
        "id": "annotated-rows-by-identity",
        "base": "annotated.py",
        "patch": [
            [
                "if y_prev.dim() != 1 or y_prev.size(0) != state.src_mask.size(0):",
                "if y_prev.dim() != 1 or y_prev.size(0) is not state.src_mask.size(0):  # FAULT",
            ],
        ],
        "fault": "decode_step compares the sizes with `is not`: equal sizes are one object only "
        "up to 256 (CPython's small integers), so 257 rows or more raise ValueError",
        "expected": {
            "failing": [STEP],
            "dependent": [],
            "diagnosis": ["264 rows", "!="],
            "notes": "every decoding test but the decode_step test's many-rows case uses at most "
            "a few rows (translate searches row by row here).",
        },
    },
    {
        "id": "annotated-translate-rows-by-identity",
        "base": "annotated.py",
        "patch": [
            [
                "        memory = model.encode(src, src_mask)\n        result = [",
                "        memory = model.encode(src, src_mask)\n"
                "        if memory.size(0) is not src.size(0):  # FAULT: identity, not equality\n"
                '            raise ValueError("the encoder lost rows")\n'
                "        result = [",
            ],
        ],
        "fault": "translate checks that every row was encoded with `is not`: 257 rows or more "
        "raise ValueError",
        "expected": {
            "failing": [TRANSLATE],
            "dependent": [],
            "diagnosis": ["translate on 264 rows", "!="],
            "notes": "decode_step is right; only translate with more than 256 rows meets it.",
        },
    },
]
