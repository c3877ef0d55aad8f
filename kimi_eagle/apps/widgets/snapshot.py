"""``SnapshotBox``: a widget box that also carries a static HTML snapshot of its view; :func:`notebook_html`:
an executed notebook as a static page that shows those snapshots offline."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import ipywidgets as W


class SnapshotBox(W.VBox):
    """A VBox whose display also carries ``text/html``: a static snapshot of the view when it was displayed.

    A live front end renders the widget; a static export (:func:`notebook_html`, the batch's HTML pages)
    shows the snapshot instead of an empty output."""

    def __init__(self, children: Sequence[W.Widget], snapshot: Callable[[], str], **kw: Any) -> None:
        super().__init__(list(children), **kw)
        self._snapshot = snapshot

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/html"] = ('<div class="ke-snapshot"><p style="color:#777;font-size:12px">static snapshot of the '
                             "widget's first view (interactive when the notebook runs)</p>" + self._snapshot() + "</div>")
        return data


# --------------------------------------------------------------------------------------------
# static HTML exports

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def static_notebook(nb: Any) -> Any:
    """``nb`` (an nbformat notebook, changed in place and returned) ready for a static export.

    nbconvert prefers a widget view to ``text/html`` and, with widget state saved, loads the widget
    manager from a CDN: offline the output is blank. Here every output that also carries ``text/html`` (a
    :class:`SnapshotBox`'s snapshot) loses its widget view, and the saved widget state goes when no widget
    view is left, so the page needs no widget script at all."""
    views = 0
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data") or {}
            if WIDGET_VIEW in data and "text/html" in data:
                del data[WIDGET_VIEW]
            views += WIDGET_VIEW in data
    widgets = nb.get("metadata", {}).get("widgets")
    if not views and widgets is not None:
        widgets.pop(WIDGET_STATE, None)
        if not widgets:
            del nb["metadata"]["widgets"]
    return nb


def notebook_html(path: str | Path) -> str:
    """The notebook at ``path`` as one static HTML page (nbconvert's lab template) whose widget outputs show
    their snapshots offline (:func:`static_notebook`)."""
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(static_notebook(nbformat.read(str(path), as_version=4)))
    return body
