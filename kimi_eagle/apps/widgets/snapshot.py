"""``SnapshotBox``: a widget box that also carries a static HTML snapshot of its view; :func:`notebook_html`:
an executed notebook as a static page that shows those snapshots offline."""
from __future__ import annotations

import re
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


# fonts that carry Chinese, Japanese and Korean, tried after the page's own: a browser whose default fonts lack
# CJK glyphs draws boxes (notebook 01's Kimi tokens) unless a family that has them is named (#46)
CJK_FONTS = ('"Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "PingFang SC", "Hiragino Sans GB", '
             '"Microsoft YaHei", "WenQuanYi Micro Hei", "Noto Sans CJK JP", "Noto Sans CJK KR"')
CJK_MONO = ('"Noto Sans Mono CJK SC", "Sarasa Mono SC", ' + CJK_FONTS)
SANS = "system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial"
MONO = "ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono'"
CJK_STYLE = ("<style id='ke-cjk-fonts'>"  # JupyterLab's font variables (nbconvert's lab template), then plain elements
             f":root{{--jp-ui-font-family:{SANS},{CJK_FONTS},sans-serif;--jp-content-font-family:{SANS},{CJK_FONTS},"
             f"sans-serif;--jp-code-font-family:{MONO},{CJK_MONO},monospace}}"
             f"body{{font-family:{SANS},{CJK_FONTS},sans-serif}}"
             f"pre,code,.ke-chips,.ke-aligned{{font-family:{MONO},{CJK_MONO},monospace}}</style>")
CJK_NOTE = ("<p class='ke-cjk-note' style='color:#555;font-size:12px;margin:4px 0'>This page shows Chinese, Japanese "
            "or Korean text. It asks for a CJK font (Noto Sans CJK, Source Han Sans, PingFang, Microsoft YaHei, …); a "
            "browser with none installed draws such characters as boxes — install one (e.g. the fonts-noto-cjk "
            "package) to read them.</p>")
CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")


def cjk_fonts(page: str, content: str | None = None) -> str:
    """``page`` (an HTML page) with :data:`CJK_STYLE` last in its head, so its text falls back to a CJK font, and,
    when ``content`` (the text shown; default the page) holds CJK characters, :data:`CJK_NOTE` at the top of its
    body, saying what to install if they show as boxes."""
    page = page.replace("</head>", CJK_STYLE + "\n</head>", 1)
    if CJK.search(page if content is None else content):
        page = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + CJK_NOTE, page, count=1)
    return page


def notebook_html(path: str | Path) -> str:
    """The notebook at ``path`` as one static HTML page (nbconvert's lab template) whose widget outputs show
    their snapshots offline (:func:`static_notebook`), with a font stack that falls back to CJK fonts
    (:func:`cjk_fonts`)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = static_notebook(nbformat.read(str(path), as_version=4))
    body, _ = HTMLExporter().from_notebook_node(nb)
    return cjk_fonts(body, nbformat.writes(nb))  # the notebook's cells and outputs say whether it shows CJK text
