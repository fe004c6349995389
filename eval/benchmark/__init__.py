"""The benchmark: CUPID's data and settings, the two tasks and their stages, the runner and its run directory, the
records, the summary and the statistics over personas."""
