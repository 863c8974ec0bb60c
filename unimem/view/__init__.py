"""``unimem view``: recordings and ``unimem compare`` results as one self-contained HTML page.

Above observe (the recordings it reads and their labels) and compare (the comparisons it shows,
their files and tables): ``write_view`` and ``view_html`` live in ``unimem.view.page``.
"""

from unimem.view.page import FIGURES, ViewPage, view_html, write_view

__all__ = ["FIGURES", "ViewPage", "view_html", "write_view"]
