"""Interop at the edge: a sweep's plan as another harness's task, and that harness's logged
samples back into a run folder (`lm_eval.py`: lm-evaluation-harness). Above the run folder and
the sweep, whose plans and statistics it uses; below the CLI."""
