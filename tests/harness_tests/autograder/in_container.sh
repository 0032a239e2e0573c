#!/bin/bash
# Runs inside the simulated Gradescope container (tests/harness_tests/test_autograder.py), as
# root: Gradescope's image build (run_autograder copied to /autograder, setup.sh run once), then
# Gradescope's run per submission (a fresh /autograder/submission, run_autograder), each
# results.json and what was left running copied to /xfmr-out.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$1" = userns ]; then  # a fresh proc of this pid namespace, fully visible (not masked)
    mount -t proc proc /proc || { echo "cannot mount proc" > /xfmr-out/driver.error; exit 90; }
fi
now() { date +%s.%N; }
cp /autograder/source/run_autograder /autograder/run_autograder
begun=$(now)
XFMR_SKIP_INSTALL=1 XFMR_VENV=/opt/xfmr-oracle/venv bash /autograder/source/setup.sh \
    > /xfmr-out/setup.log 2>&1
echo "$? $begun $(now)" > /xfmr-out/setup.status
student=$(id -u xfmr-student 2>/dev/null || echo none)
for run in /xfmr-in/*/; do
    name=$(basename "$run")
    cp "/xfmr-in/run_autograder.$(cat "$run/mode")" /autograder/run_autograder
    rm -rf /autograder/submission && mkdir /autograder/submission
    cp -r "$run/files/." /autograder/submission/
    begun=$(now)
    (cd /autograder && /autograder/run_autograder > "/xfmr-out/$name.stdout" 2>&1)
    echo "$? $begun $(now)" > "/xfmr-out/$name.status"
    sleep 1  # a daemon that survived would rewrite results.json by now
    cp /autograder/results/results.json "/xfmr-out/$name.json" 2>/dev/null
    : > "/xfmr-out/$name.left"
    for proc in /proc/[0-9]*; do  # the student's user's processes, and any Python, still running
        uid=$(awk '/^Uid:/ {print $2}' "$proc/status" 2>/dev/null)
        state=$(awk '/^State:/ {print $2}' "$proc/status" 2>/dev/null)
        comm=$(cat "$proc/comm" 2>/dev/null)
        if [ -n "$state" ] && [ "$state" != Z ] && { [ "$uid" = "$student" ] || [[ "$comm" == python* ]]; }; then
            echo "${proc#/proc/} uid=$uid $comm $(tr '\0' ' ' < "$proc/cmdline" | cut -c1-80)" \
                >> "/xfmr-out/$name.left"
        fi
    done
    ls /tmp | grep '^xfmr-forger-ran' > "/xfmr-out/$name.marks" 2>/dev/null
done
exit 0
