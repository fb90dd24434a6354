"""`kvphase conform`: does an engine run the compressed models right? Each reference model (a small
GGUF in an engine's own layout whose per-phase profile, or per-target log-probabilities, a committed
run folder holds) is scored through the engine on its folder's own plan, and the two are compared
target by target and residue by residue (`compare.py`); `references.py` names the models, `check.py`
runs them and writes the run folder."""
