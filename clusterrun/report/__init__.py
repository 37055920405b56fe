"""The HTML pages: one self-contained file per doctor round (``runs/doctor-<time>/report.html``) and per run
(``runs/<id>/report.html``), rendered from what their directories hold (:mod:`.doctor_data`, :mod:`.run_data`),
so a page can be written again at any time, offline, and says what is missing instead of failing."""

from __future__ import annotations

from clusterrun.report.write import PAGE, write_doctor_page, write_run_page

__all__ = ["PAGE", "write_doctor_page", "write_run_page"]
