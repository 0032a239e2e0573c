"""Reports: the one atomic writer every job uses (writer), and the matrix's renderers (text grid,
CSV, JSON, Markdown, HTML, Stryker's schema). A grade's and a mutation score's renderers live
beside the job that computes them."""
