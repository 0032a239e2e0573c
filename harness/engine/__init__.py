"""The engine: one way to run a suite of tests over a set of subjects, for every view.

- run: a suite over subjects, one worker process per subject, verdicts reached here (run_suite,
  run_subject, run_test); what a subject's row is as plain data (run_row);
- work: a unit of work and the local executor (threads here, each driving one worker); files as
  plain data for units that run elsewhere;
- cluster: the Dask executor (the [dist] extra), for --scheduler;
- executors: which executor a run uses, chosen above both;
- cache: cells kept by a hash of what decides them (--incremental);
- coverage: a mutant's cells its change cannot reach, inferred from impl's traced run;
- fingerprint: content hashes of the project's code, for the cache and for a cluster's workers.

The jobs (harness.jobs) are the views: the kill-rate matrix, a grade, a mutation score.
"""
