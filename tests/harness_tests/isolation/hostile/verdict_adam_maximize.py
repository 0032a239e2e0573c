# ruff: noqa: F821, F811  (an overlay: the names come from the source it is appended to)
# Attack (issue 34): torch's own Adam with the paper's betas and eps, no weight decay, and
# maximize=True: every field the old law read is right, and every update climbs the loss.


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, maximize=True)
