"""A weak student suite: it checks shapes and the schedule's first value, little else."""

import tinyllm.xfmr.transformer as T
import torch


def test_noam_first_rate():
    assert abs(T.noam_rate(0, 16, 4) - 0.03125) < 1e-9


def test_logits_have_the_right_shape():
    torch.manual_seed(0)
    m = T.Transformer(
        T.TransformerConfig(
            src_vocab=9, tgt_vocab=9, d_model=8, n_heads=2, d_ff=16, n_enc=1, n_dec=1
        )
    ).eval()
    src = torch.tensor([[3, 4, 5]])
    tgt = torch.tensor([[1, 6]])
    out = m(src, tgt, src > 0, tgt > 0)
    assert out.shape == (1, 2, 9)


def test_loss_is_positive():
    logits = torch.randn(4, 9)
    loss = T.label_smoothed_loss(logits, torch.tensor([3, 4, 5, 6]), 0.1, pad_id=0)
    assert float(loss) > 0
