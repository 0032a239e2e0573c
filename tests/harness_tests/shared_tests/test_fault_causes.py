"""The fault catalog (mutants/student_faults.py): each fault students really write, planted in
impl and in examples/correct_submission.py, is named at the right place with the right cause,
and no message states a cause it has not established.

Each planted host is trusted code (ours, patched), loaded in this process and run through the
probes a grader's worker runs; the parent's diagnosis (harness.shared_tests.diagnosis.diagnose,
as a grade calls it) or the owning test then judges the plain data. No worker, no sandbox: a
fault costs about a second. The default tier runs a few faults; the slow tier all of them.

Run as a script it prints (and with --out writes) the table of results/fault_causes.md.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.isolation.child import probes
from harness.isolation.child.load import from_source
from harness.shared_tests.diagnosis import diagnose
from harness.shared_tests.laws import BY_NAME
from harness.shared_tests.record import Failure
from mutants.student_faults import BY_ID, DIAGNOSIS, FAULTS, HOSTS, StudentFault

KV_CACHE = "test_decode_step_reads_a_kv_cache"
AGREES = "the forward pass agrees with the oracle"
# a fault of one placement leaves the other's configs alone
ONLY_PRE = {"pre-ln-residual", "no-final-norm"}


def planted(fault: StudentFault, host: str):
    """The host with the fault written in, loaded as a fresh module."""
    name = "xfmr_fault_" + re.sub(r"\W", "_", fault.id) + f"_{host}"
    return from_source(fault.source(host), f"<{fault.id} in {HOSTS[host].name}>", name=name)


def caller(module) -> Callable:
    return lambda probe, **inputs: probes.PROBES[probe](module, **inputs)


def verdict(test: str, call: Callable) -> str:
    """A shared test's failure message, or 'passed'."""
    try:
        BY_NAME[test].check(call)
    except Failure as e:
        return str(e)
    return "passed"


def first(line: str) -> str:
    """A diagnosis line's first divergence, up to the logits' overall error."""
    return line.split("; the logits differ", 1)[0].split("; largest:", 1)[0]


def said(fault: StudentFault, host: str) -> dict[str, str]:
    """What the grade says of the planted fault: per golden config the diagnosis (a value
    fault), else the owning test's message."""
    call = caller(planted(fault, host))
    if fault.owner == DIAGNOSIS:
        return diagnose(call)
    return {fault.owner: verdict(fault.owner, call)}


def judged(fault: StudentFault, lines: dict[str, str]) -> tuple[bool, bool]:
    """(the place is right, the cause is right) over every line: a config the fault cannot
    reach agrees with the oracle; every other names the place first with the cause."""
    place = cause = True
    for config, line in lines.items():
        if fault.owner != DIAGNOSIS:
            place &= fault.place in line
            cause &= fault.cause in line
        elif fault.id in ONLY_PRE and config.startswith("post-LN"):
            place &= line.startswith(AGREES)
            cause &= line.startswith(AGREES)
        else:
            place &= bool(re.match(f"first divergence: {re.escape(fault.place)}([,:;]|$)", line))
            cause &= fault.cause in first(line)
    return place, cause


# a fast subset for the default tier: one attention fault, one norm fault, and the messages of
# the tests that own a fault
FAST = ("no-scale", "norm-axis", "noam-step")


def cases(ids: tuple[str, ...] | None):
    return [
        pytest.param(f, host, id=f"{f.id}-{host}")
        for f in FAULTS
        if ids is None or f.id in ids
        for host in HOSTS
    ]


def check(fault: StudentFault, host: str) -> None:
    lines = said(fault, host)
    place, cause = judged(fault, lines)
    assert place, f"{fault.id} in {host}: the place is not {fault.place!r}: {lines}"
    assert cause, f"{fault.id} in {host}: the cause does not say {fault.cause!r}: {lines}"


@pytest.mark.parametrize("fault, host", cases(FAST))
def test_a_common_fault_is_named_with_its_cause(fault, host):
    check(fault, host)


@pytest.mark.slow
@pytest.mark.parametrize("fault, host", cases(tuple(f.id for f in FAULTS if f.id not in FAST)))
def test_every_catalog_fault_is_named_with_its_cause(fault, host):
    check(fault, host)


def test_the_catalog_plants_every_fault_in_both_hosts():
    # every patch applies exactly once, and the planted source differs from the host's
    assert len(FAULTS) >= 12
    for fault in FAULTS:
        for host, path in HOSTS.items():
            assert fault.source(host) != path.read_text(), (fault.id, host)


@pytest.mark.parametrize("host", list(HOSTS))
def test_the_correct_hosts_get_no_cause(host):
    module = from_source(HOSTS[host].read_text(), f"<{host}>", name=f"xfmr_fault_none_{host}")
    for config, line in diagnose(caller(module)).items():
        assert line == AGREES, (config, line)


@pytest.mark.parametrize("host", list(HOSTS))
def test_the_kv_cache_test_says_not_judged_of_a_forward_pass_fault(host):
    # the wrong-axis LayerNorm makes a one-position step's logits independent of the weights: a
    # cache that is read still looks recomputed, and only a right forward pass tells them apart
    message = verdict(KV_CACHE, caller(planted(BY_ID["norm-axis"], host)))
    assert message.startswith("not judged: test_golden_torch must pass first"), message
    assert "not read from a cache" not in message, message


@pytest.mark.slow
@pytest.mark.parametrize("fault, host", cases(None))
def test_no_message_states_a_cause_it_has_not_established(fault, host):
    # every host reads a KV cache: the kv-cache test never says it recomputes; a fault another
    # test owns (dropout in eval, Noam) gets no cause from the forward pass's diagnosis
    call = caller(planted(fault, host))
    message = verdict(KV_CACHE, call)
    assert "not read from a cache" not in message, message
    if fault.owner != DIAGNOSIS:
        for config, line in diagnose(call).items():
            assert line == AGREES or re.fullmatch(r"first divergence: [^:]*", first(line)), (
                config,
                line,
            )


def table() -> tuple[str, int, int, int]:
    """The results table's rows, and the counts: place right, cause right, of how many."""
    rows, places, causes, n = [], 0, 0, 0
    for fault in FAULTS:
        for host in HOSTS:
            lines = said(fault, host)
            place, cause = judged(fault, lines)
            places, causes, n = places + place, causes + cause, n + 1
            told = "; ".join(sorted({first(line) for line in lines.values()}))
            told = told.replace("|", "\\|")
            mark = {True: "yes", False: "**no**"}
            rows.append(f"| {fault.id} | {host} | {mark[place]} | {mark[cause]} | {told} |")
    return "\n".join(rows), places, causes, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    args = parser.parse_args()
    rows, places, causes, n = table()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    text = (
        f"place right: {places}/{n}; cause right: {causes}/{n} "
        f"(commit {commit}, {datetime.date.today()})\n\n"
        "| fault | host | place | cause | what the grade says (first divergence per config, or "
        "the owning test's message) |\n| --- | --- | --- | --- | --- |\n" + rows + "\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
