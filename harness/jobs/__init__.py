"""The jobs, one module each: the kill-rate matrix (shared tests x impl, the torch copy and the
mutants), grading a submission (shared tests x one untrusted submission) and the mutation score
of a student's suite (that suite x impl, the torch copy and the mutants). They share the engine
and never import each other."""
