"""The peak planner: least recompute under a budget on the step's peak live memory.

``peak_search`` (``solve.py``) runs the phases of ``schedule.py`` on one ``PeakState``
(``state.py``); each phase is a strategy module ``strategy_*.py`` with ``run(state, seconds)``,
built on the algorithms beside it: the relaxation (``rows.py``, ``cuts.py``, ``relaxation.py``),
the cheap candidates (``candidates.py``), repairs, grafts, the layer mix and the local search
(``repair.py``, ``graft.py``, ``layers.py``, ``search.py``). Time shares live in ``settings.py``.
"""

from ..errors import PeakInfeasibleError
from .solve import peak_search

__all__ = ["PeakInfeasibleError", "peak_search"]
