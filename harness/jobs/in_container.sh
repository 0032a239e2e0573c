#!/bin/bash
# Runs inside the simulated autograder container (harness/jobs/simulated_container.py), as root:
# an image's build (setup: XFMR_SKIP_INSTALL=1, the venv bound at /opt/xfmr-oracle/venv) or one
# grading job (run), its output, exit status and wall time to /xfmr-out; after a job, what is
# still running of the student's user (or any Python) and what is left in /tmp.
# usage: in_container.sh VARIANT PHASE WORKDIR STUDENT COMMAND...
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
variant=$1 phase=$2 workdir=$3 student_name=$4
shift 4
if [ "$variant" = userns ]; then  # a fresh proc of this pid namespace, fully visible (not masked)
    mount -t proc proc /proc || { echo "cannot mount proc" > /xfmr-out/output; exit 90; }
fi
now() { date +%s.%N; }
begun=$(now)
if [ "$phase" = setup ]; then
    (cd "$workdir" && XFMR_SKIP_INSTALL=1 XFMR_VENV=/opt/xfmr-oracle/venv "$@") \
        > /xfmr-out/output 2>&1
else
    (cd "$workdir" && "$@") > /xfmr-out/output 2>&1
fi
echo "$? $begun $(now)" > /xfmr-out/status
[ "$phase" = setup ] && exit 0
sleep 1  # a daemon that survived would rewrite results.json by now
student=$(id -u "$student_name" 2>/dev/null || echo none)
: > /xfmr-out/left
for proc in /proc/[0-9]*; do  # the student's user's processes, and any Python, still running
    uid=$(awk '/^Uid:/ {print $2}' "$proc/status" 2>/dev/null)
    state=$(awk '/^State:/ {print $2}' "$proc/status" 2>/dev/null)
    comm=$(cat "$proc/comm" 2>/dev/null)
    if [ -n "$state" ] && [ "$state" != Z ] && { [ "$uid" = "$student" ] || [[ "$comm" == python* ]]; }; then
        echo "${proc#/proc/} uid=$uid $comm $(tr '\0' ' ' < "$proc/cmdline" | cut -c1-80)" \
            >> /xfmr-out/left
    fi
done
ls -A /tmp > /xfmr-out/tmp 2>/dev/null
exit 0
