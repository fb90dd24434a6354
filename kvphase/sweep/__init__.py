"""Sweeps: the plan, token-exact placement of records, tasks, the run folder, its analysis, report and comparison."""
