"""A study's report, from its ``results.json``: ``report.md``, ``report.html`` and its figures.

* :mod:`.document` - the report itself (:func:`write_report`, :func:`render_html`): tables, the claims' table,
  figures in place, a contents list;
* :mod:`.claims` - the paper's claims decided on the results (:func:`evaluate_claims`), on the statistics of
  :mod:`.verdicts` (spreads over seeds and permutations, intervals at any level, p-values, Holm);
* :mod:`.figures` - the PNG figures; :mod:`.header` - the title, the paragraph under it and what the study varied;
  :mod:`.shift_size` - fragility at the shift size;
* :mod:`.runs` - the study's runs as the tables, figures and claims read them (by condition, means over seeds,
  training curves).

Everything is derived from the results, so a report can be rebuilt, restyled or re-thresholded without
re-running a model (``posgeom report RUN_DIR``).
"""

from .claims import evaluate_claims
from .document import PAPER, render_html, write_report

__all__ = ["write_report", "render_html", "PAPER", "evaluate_claims"]
