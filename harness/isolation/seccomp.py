"""The seccomp filter of every sandbox: the kernel's own interfaces no namespace covers, denied.

bubblewrap's namespaces cover files, processes, the network, ipc and host names, but not
everything the kernel keeps per user or per machine. The sandbox's uid maps to the grader's, so
without this filter a submission could read and write the grader's session keyring (issue 21:
a key of the grader's appeared in a grade report, and a student suite shared fingerprints of the
subjects across sandboxes through it). The filter is compiled here, in the trusted parent, by
libseccomp (through pyseccomp, its ctypes bindings) and handed to bwrap (`--seccomp FD`), which
loads it just before it starts the worker: it holds for the worker and everything it starts,
and cannot be removed from inside.

Everything not listed is allowed (Python, torch, numpy, pytest and Hypothesis run unchanged,
threads and fork included); what is listed fails with EPERM, not a kill, so the code that tried
gets a clear PermissionError. The list is at least what Docker's default profile denies an
unprivileged container, group by group in DENIED with the reason; besides the plain names:

- clone with a namespace flag (CLONE_NEW*) fails like unshare (one rule per flag bit);
- clone3 fails with ENOSYS, as in Docker: its flags lie in memory a filter cannot read, and
  glibc creates threads with clone when clone3 is "not implemented" (EPERM would break threads);
- personality: only Linux's default and the two that Docker allows (PER_LINUX32, UNAME26) may
  be set; any other flag (ADDR_NO_RANDOMIZE turns ASLR off) fails, and so does the query
  personality(0xffffffff), which nothing here uses;
- ioctl TIOCSTI and TIOCLINUX (typing into a terminal) and socket(AF_VSOCK) (the host, from a
  virtual machine) fail;
- a system call of another ABI (32-bit int 0x80, x32) fails whatever it is: no rule above would
  see it under its own number.

If pyseccomp or the system's libseccomp is missing, `program()` raises SeccompUnavailable and
the sandbox refuses to start (harness.isolation.sandbox fails closed).
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

# group -> (why, system calls). A name this libseccomp does not know is denied by its number
# (NEWER) or, where the kernel has no such call on this architecture, needs no rule.
DENIED: dict[str, tuple[str, tuple[str, ...]]] = {
    "keyrings": (
        "kernel keyrings are per user, not per namespace: the grader's keys and a channel "
        "between sandboxes",
        ("keyctl", "add_key", "request_key"),
    ),
    "tracing and other processes' memory": (
        "reading or steering another process (the pid namespace already hides the grader)",
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    ),
    "kernel programs and performance counters": (
        "eBPF and perf expose kernel state and are frequent kernel attack surface",
        ("bpf", "perf_event_open", "lookup_dcookie", "fanotify_init"),
    ),
    "userfaultfd and io_uring": (
        "kernel attack surface with no use here (Docker denies both)",
        ("userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"),
    ),
    "mounts": (
        "the sandbox's file system view is the parent's choice and stays as set up",
        (
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "chroot",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "statmount",
            "listmount",
        ),
    ),
    "namespaces": (
        "no new namespace and no entering another (bwrap already disables user namespaces)",
        ("unshare", "setns"),
    ),
    "handles on host files": (
        "a file handle opens a file by inode, around the mount view",
        ("name_to_handle_at", "open_by_handle_at"),
    ),
    "kernel modules and kexec": (
        "loading code into the kernel",
        (
            "init_module",
            "finit_module",
            "delete_module",
            "create_module",
            "query_module",
            "get_kernel_syms",
            "kexec_load",
            "kexec_file_load",
        ),
    ),
    "the machine": (
        "reboot, swap, process accounting, quotas, the kernel log, the terminal, host names",
        (
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "vhangup",
            "sethostname",
            "setdomainname",
        ),
    ),
    "clocks": (
        "setting or adjusting the system's time",
        ("settimeofday", "stime", "clock_settime", "clock_adjtime", "adjtimex"),
    ),
    "hardware": (
        "raw I/O ports and legacy modes",
        ("iopl", "ioperm", "vm86", "vm86old", "modify_ldt"),
    ),
    "obsolete": (
        "old interfaces no program here needs (Docker denies them)",
        ("uselib", "ustat", "sysfs", "_sysctl", "nfsservctl"),
    ),
    "memory policy of other processes": (
        "moving another process's pages (Docker needs CAP_SYS_NICE for these)",
        ("move_pages", "migrate_pages"),
    ),
}
# Calls newer than some libseccomp releases (2.5.4 knows neither), by their number: the same on
# every architecture since Linux 5.x's unified table.
NEWER = {"statmount": 457, "listmount": 458}

# clone's namespace flags: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
# personality's argument bits that may be set: PER_LINUX32 (0x8) and UNAME26 (0x20000)
PERSONALITY_ALLOWED = 0x00000008 | 0x00020000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
AF_VSOCK = 40


class SeccompUnavailable(RuntimeError):
    """The filter cannot be built here (no pyseccomp, no libseccomp, an unknown call)."""


def denied() -> list[str]:
    """Every system call denied by name, in DENIED's order."""
    return [name for _, names in DENIED.values() for name in names]


# Refused too where a worker has no cgroup (harness.isolation.cgroups): memory no address-space
# limit counts, which only a cgroup could bound.
UNCOUNTED_MEMORY = ("memfd_create", "shmget")


@functools.lru_cache(maxsize=2)
def program(deny_memfd: bool = False) -> bytes:
    """The compiled BPF program (struct sock_filter[]) that bwrap --seccomp loads; with
    `deny_memfd`, UNCOUNTED_MEMORY's calls fail with EPERM too."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: no libseccomp.so
        raise SeccompUnavailable(
            f"the seccomp filter cannot be built ({e}): install libseccomp "
            "(apt-get install -y libseccomp2) and pyseccomp (pip install pyseccomp)"
        ) from None
    eperm = seccomp.ERRNO(errno.EPERM)
    try:
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        f.set_attr(seccomp.Attr.ACT_BADARCH, eperm)
        for name in denied() + list(UNCOUNTED_MEMORY if deny_memfd else ()):
            number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
            if number == -1:  # unknown to this libseccomp
                if name not in NEWER:
                    raise SeccompUnavailable(f"libseccomp does not know the system call {name}")
                number = NEWER[name]
            f.add_rule(eperm, number)  # a call this architecture lacks (< -1) adds no rule
        for flag in CLONE_NAMESPACES:
            f.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        for bit in range(32):
            if not (1 << bit) & PERSONALITY_ALLOWED:
                flag = 1 << bit
                f.add_rule(eperm, "personality", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        for request in (TIOCSTI, TIOCLINUX):
            f.add_rule(eperm, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
        f.add_rule(eperm, "socket", seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, AF_VSOCK))
        with tempfile.TemporaryFile() as out:
            f.export_bpf(out)
            out.seek(0)
            return out.read()
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp refused the filter: {e}") from None


def number(name: str) -> int:
    """A system call's number on this machine (for the trial sandbox's probe)."""
    import pyseccomp as seccomp

    return seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)


def descriptor(deny_memfd: bool = False) -> int:
    """A fresh descriptor holding the program (`program(deny_memfd)`), at offset 0, for one
    bwrap (which reads it and closes its copy); the caller closes its own after starting bwrap."""
    fd = os.memfd_create("xfmr-seccomp")
    data = program(deny_memfd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
