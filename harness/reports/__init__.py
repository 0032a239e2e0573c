"""Reports: every renderer of the engine's records, and the one atomic writer every job uses.

matrix.py (the kill-rate matrix: grid, CSV, JSON, Markdown, HTML, Stryker's schema), grade.py (a
grade's text, JSON and JUnit), gradescope.py (Gradescope's results.json: a grade's, a refusal's),
prairielearn.py (PrairieLearn's results.json: a grade's, and the not-graded ones), grades.py (a
batch of grades as tables; `xfmr summarize`), class_report.py (a batch's report.html: totals,
histogram, grid, causes), score.py (a student suite's mutation score: text, JSON, Stryker), safe.py
(formula-safe CSV, escaped HTML and Markdown), writer.py. The jobs run and assemble; nothing here
runs a subject.
"""
