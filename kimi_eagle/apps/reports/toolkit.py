"""The one report toolkit: figures, titles, saving, "no data" panels, tables, notes and the HTML page shell.

Every report page (``kimi-eagle report``, ``kimi-eagle billing``, the batch summary, ``kimi-eagle audit``) is built
from these parts and shares one stylesheet (:data:`STYLESHEET`, embedded by :func:`html_page`; a page never carries
another). Charts are drawn on :class:`matplotlib.figure.Figure` objects, so nothing here touches pyplot's backend,
and saved through :func:`kimi_eagle.io.write_figure` (atomically). A part that fails (a chart, a section) becomes a
visible note: :func:`section`, :func:`chart_embedder` and :func:`left_out_section` show the notes that
:func:`kimi_eagle.diff.summary.left_out_note` records.
"""
from __future__ import annotations

import base64
import html
import math
import re
import textwrap
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

from kimi_eagle import data_kinds
from kimi_eagle.diff.summary import error_reason, left_out_note
from kimi_eagle.io import write_figure

Notes = list[dict[str, Any]]

# one verdict colour scheme on every page and chart: agreement green, a benign difference (same bytes, or a known
# provider convention) blue, a real difference red, not counted grey
VERDICT_COLORS = {"exact": "#388e3c", "match": "#388e3c", "bpe_split": "#1976d2", "explained": "#1976d2",
                  "semantic": "#d32f2f", "unexplained": "#d32f2f", "no_billing": "#9e9e9e", "missing_engine": "#9e9e9e",
                  "missing_api": "#9e9e9e", "error": "#424242"}
# one sign convention on every page: stated at the top, and in every axis label and table header that shows a difference
SIGN_CONVENTION = ("Signs: a token delta (records.parquet and hunks.parquet token_delta, the token-delta chart, the "
                   "inspector, the playground) is reconstructed − engine tokens: negative means the reconstruction has "
                   "fewer tokens. Billing gaps are reference − reconstructed (billed − reconstructed; explained by hunks: "
                   "engine − reconstructed = −token delta): positive means the reconstruction has fewer tokens. The part "
                   "of a billing gap not explained by hunks is (billed − reconstructed) − (engine − reconstructed) = "
                   "billed − engine.")
# run status, in the same scheme: finished green, failed red, not there grey
STATUS_COLORS = {"ok": "#388e3c", "error": "#d32f2f", "failed": "#d32f2f", "missing": "#9e9e9e",
                 "missing_engine": "#9e9e9e", "missing_api": "#9e9e9e"}
SMALL_COUNTS = 200  # a histogram whose tallest bar is at most this stays on a linear axis


def verdict_color(name: Any) -> str | None:
    """The colour of a verdict (``exact``, ``explained:CONVENTION``, ``verdict › semantic``, ...), or None."""
    key = str(name).split(" › ")[-1].split(":")[0].strip()
    return VERDICT_COLORS.get(key)


def count_axis(ax: Any, tallest: float, label: str | None = "records", axis: str = "y") -> None:
    """A count axis (``axis``: ``"x"`` or ``"y"``): linear with integer ticks while the tallest bar is at most
    :data:`SMALL_COUNTS`, else symlog (said in the label); ``label=None`` keeps the axis label as it is."""
    if tallest > SMALL_COUNTS:
        getattr(ax, f"set_{axis}scale")("symlog", linthresh=10)
        label = f"{label} (symlog)" if label else label
    else:
        integer_axis(ax, axis)
    if label:
        getattr(ax, f"set_{axis}label")(label)


def integer_axis(ax: Any, axis: str = "y") -> None:
    """Ticks on whole numbers only (counts: records, hunks, tokens), never 0.25 steps."""
    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def finding(text_html: str) -> str:
    """The one-line plain-language finding at the top of a page (``text_html`` already escaped)."""
    return f"<p class='finding'><b>Finding:</b> {text_html}</p>"

# --------------------------------------------------------------------------------------------
# figures


def figure(figsize: tuple[float, float], ncols: int = 1, layout: str | None = None) -> tuple[Figure, Any]:
    """A figure detached from pyplot (no backend involved) and its axes (one, or a row of ``ncols``);
    ``layout="constrained"`` lays out titles, legends outside the axes and a suptitle without overlap."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(1, ncols)


DATA_TAGS = dict(data_kinds.TAGS)  # the one vocabulary (kimi_eagle.data_kinds): real, simulated, toy, stand-in: …
TOY_NOTE = ("REAL engine, toy model (not Kimi's rates): a small model that is not Kimi — stories260K (a 260K-parameter "
            "story model with its own tokenizer) or tiny-kimi (a small model over Kimi token IDs trained for minutes on "
            "CPU, which emits malformed outputs) — served by the real engine and collected through the real API path. "
            "Its mismatch and billing rates say nothing about Kimi or any provider; they only show the kit end to end.")


def data_tag(data: str | None) -> str:
    """The tag every chart of ``data`` carries: :func:`kimi_eagle.data_kinds.data_tag` (``[REAL data]``,
    ``[STAND-IN data: stories260K served locally]``, ...), ``[kind not recorded]`` for None (a kind the inputs do
    not state is never real), else ``[<DATA> data]``."""
    if data is None:
        return data_kinds.NOT_RECORDED
    try:
        return data_kinds.data_tag(data)
    except ValueError:
        return DATA_TAGS.get(data, f"[{data.upper()} data]")


def title(ax: Any, text: str, data: str | None = None, fontsize: float = 10.5, wrap_to: str = "axes") -> None:
    """Set ``ax``'s title, prefixed with the data kind (:func:`data_tag`: ``[SIMULATED data]`` / ``[REAL data]`` /
    the toy-model tag) when ``data`` is given, wrapped to the width of the axes (``wrap_to="axes"``) or of the
    figure (``"figure"``) so it is never clipped."""
    full = f"{data_tag(data)} {text}" if data else text
    fig = ax.figure
    pos = ax.get_position()
    centre = pos.x0 + pos.width / 2  # a title is centred over its axes: "figure" is the room on both sides of it
    width = pos.width if wrap_to == "axes" else 2 * min(centre, 1 - centre)
    chars = max(20, int(width * fig.get_figwidth() * 72 / (fontsize * 0.55)))
    ax.set_title("\n".join(textwrap.wrap(full, chars)), fontsize=fontsize)


def evidence_title(ax: Any, text: str, data: str, evidence: str) -> None:
    """Set ``ax``'s title (wrapped to the axes) with a last line naming the evidence and the data kind:
    ``text\\n[billing-only evidence] [REAL data]`` (the data kind as :func:`data_tag` says it)."""
    title(ax, text)
    ax.set_title(f"{ax.get_title()}\n[{evidence}] {data_tag(data)}", fontsize=10.5)


def figure_tag(fig: Figure, data: str, evidence: str | None = None) -> None:
    """The data tag (and evidence) once, as the figure's suptitle, for a figure of several panels: each panel
    keeps a short title of its own, so side-by-side titles never collide."""
    fig.suptitle(f"[{evidence}] {data_tag(data)}" if evidence else data_tag(data), fontsize=10.5)


def plain(label: Any) -> str:
    """``label`` as literal text for matplotlib: ``$`` escaped so that a name like ``$\\frac{$`` is not read as
    mathtext."""
    return str(label).replace("$", r"\$")


def no_data(ax: Any, what: str) -> None:
    """Say ``no <what>`` in the middle of an empty panel."""
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="#777")


def fit_titles(fig: Figure) -> bool:
    """Re-wrap every axes title wider than the room around its axes' centre once the layout is known (long run
    names push an axes right, and a title wrapped to the figure's width was cut at its edge, #35). True when one
    was re-wrapped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    width, changed = fig.bbox.width, False
    for ax in fig.axes:
        text = ax.title.get_text()
        box = ax.title.get_window_extent(renderer)
        centre = (box.x0 + box.x1) / 2
        room = 2 * min(centre, width - centre) - 8
        if text and box.width > room > 0:
            longest = max(len(line) for line in text.split("\n"))
            chars = max(12, int(longest * room / box.width) - 1)
            ax.set_title("\n".join(textwrap.wrap(" ".join(text.split()), chars)), fontsize=ax.title.get_fontsize())
            changed = True
    return changed


def save(fig: Figure, path: str | Path, dpi: int = 110, tight: bool = True) -> Path:
    """Write ``fig`` as a PNG to ``path`` (atomically; laid out tight first unless ``tight`` is False), and in the
    ``--figure-format`` beside it, at ``--dpi`` when given (:func:`kimi_eagle.apps.reports.outputs.chart_files`)."""
    from kimi_eagle.apps.reports.outputs import chart_files

    for text in fig.findobj(Text):  # no chart says "-0.0" (a bar label, an annotation, a title)
        if NEGATIVE_ZERO.search(text.get_text()):
            text.set_text(zero_without_sign(text.get_text()))
    if tight and fig.get_layout_engine() is None:
        fig.tight_layout()
    if fit_titles(fig) and not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        fig.tight_layout()  # room above for the re-wrapped title
    for target, at in chart_files(path, dpi):
        write_figure(fig, target, dpi=at)
    return Path(path)


def draw_charts(builders: dict[str, Callable[[Path], Path]], out: Path, notes: Notes | None = None) -> dict[str, Path]:
    """Run each ``builders[name](out / f"{name}.png")`` and return the written paths by name. With ``notes``, a
    chart that fails is left out and noted there (``{"part": "chart", "name", "reason"}``) while the others are
    drawn; without, the error propagates. A builder that returns None draws nothing."""
    charts: dict[str, Path] = {}
    for name, build in builders.items():
        try:
            path = build(out / f"{name}.png")
            if path is not None:
                charts[name] = path
        except Exception as e:  # the failed chart's standalone Figure is simply dropped
            if notes is None:
                raise
            notes.append(left_out_note("chart", None, error_reason(e), name=name))
    return charts


# --------------------------------------------------------------------------------------------
# HTML parts


BREAK_AFTER = re.compile(r"(?<=[_/:#=,.|])(?=\S)")  # where a long name may wrap: after _ / : # = , . |


def breakable(text: Any) -> str:
    """``text`` escaped, with a ``<wbr>`` after every ``_ / : # = , . |`` inside it: a long id, path or
    ``snake_case`` header wraps there, never inside a word."""
    return "<wbr>".join(html.escape(part) for part in BREAK_AFTER.split(str(text)))


SHORT_TOKEN = 24  # a text cell of one word up to this long never wraps (an id, a provider, a verdict)


def is_number(v: Any) -> bool:
    """A real number (an int or float, numpy's included; never a bool)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def no_negative_zero(text: str, signed: bool = False) -> str:
    """A formatted number that rounds to zero never keeps its minus (``-0.000`` → ``0.000``, or ``+0.000`` when
    ``signed``; ``-0%`` → ``0%``); any other text is returned as it is."""
    if text[:1] in "-−" and not any(c in "123456789" for c in re.split(r"[eE]", text)[0]) and any(c == "0" for c in text):
        return ("+" if signed else "") + text[1:]
    return text


NEGATIVE_ZERO = re.compile(r"(?<![\w.])[-−](?=0(?:\.0+)?(?![\d.]))")  # "-0", "−0.000" as a whole number


def zero_without_sign(text: str) -> str:
    """Every whole number in ``text`` that is a negative zero (``-0``, ``−0.000``) written without its minus."""
    return NEGATIVE_ZERO.sub("", text)


def number(v: Any, spec: str) -> str:
    """``format(v, spec)`` without a negative zero (:func:`no_negative_zero`; a ``+`` spec keeps ``+0``)."""
    return no_negative_zero(format(v, spec), signed="+" in spec)


def html_cell(v: Any, float_format: str = "{:.3f}") -> str:
    """One ``<td>``: a number right-aligned (class ``num``, ``float_format`` for a float), text left-aligned and
    :func:`breakable`; missing as ``–``."""
    if v is None or (is_number(v) and isinstance(v, (float, np.floating)) and math.isnan(v)):
        return "<td class='num'>–</td>"
    if is_number(v):
        text = no_negative_zero(float_format.format(v)) if isinstance(v, (float, np.floating)) else f"{int(v)}"
        return f"<td class='num'>{html.escape(text)}</td>"
    text = str(v)
    if len(text) <= SHORT_TOKEN and not any(c.isspace() for c in text):  # a short name or id: kept whole
        return f"<td class='tok'>{html.escape(text)}</td>"
    return f"<td>{breakable(text)}</td>"


def html_table(df: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    """``df`` as an escaped HTML table of class ``t`` (no index; missing values as ``–``; numbers right-aligned,
    text left-aligned; headers and text wrap at spaces and after ``_ / : # =``, never inside a word)."""
    head = "".join(f"<th>{breakable(c)}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(html_cell(v, float_format) for v in r) + "</tr>"
                   for r in df.itertuples(index=False, name=None))
    return f"<table class='t'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def left_out_paragraph(text_html: str) -> str:
    """A visible warning (``text_html`` is already escaped)."""
    return f"<p class='left-out'>⚠ {text_html}</p>"


def section(notes: Notes, name: str, build: Callable[[], list[str]]) -> list[str]:
    """``build()``'s HTML parts, or, when it raises, a visible note naming the section and the reason (also
    appended to ``notes`` as ``{"part": "section", "name", "reason"}``)."""
    try:
        return build()
    except Exception as e:
        note = left_out_note("section", None, error_reason(e), name=name)
        notes.append(note)
        return [left_out_paragraph(f"section “{html.escape(name)}” left out: {html.escape(note['reason'])}")]


def left_out_section(notes: Notes, said_html: str, limit: int | None = None) -> list[str]:
    """“Left out of this report”: ``said_html`` (what was left out, escaped) as a warning and a table of the
    notes (the first ``limit`` of them); nothing when there are no notes."""
    if not notes:
        return []
    rows = pd.DataFrame([{"part": n["part"], "record": n["id"] if n["id"] is not None else "–",
                          "where": n.get("name", n.get("hunk", "")), "reason": n["reason"]} for n in notes[:limit]])
    return ["<h2>Left out of this report</h2>", left_out_paragraph(said_html), html_table(rows)]


def chart_embedder(charts: dict[str, Path], notes: Notes) -> Callable[[str, str], str]:
    """``image(name, alt)``: the chart's PNG inlined as an ``<img>``, or a visible note saying why it was left out."""
    img = {k: base64.b64encode(Path(p).read_bytes()).decode() for k, p in charts.items()}

    def image(name: str, alt: str) -> str:
        if name in img:
            return f"<img alt='{html.escape(alt, quote=True)}' src='data:image/png;base64,{img[name]}'>"
        why = next((n["reason"] for n in notes if n["part"] == "chart" and n.get("name") == name), "not drawn")
        return left_out_paragraph(f"chart “{html.escape(name)}” left out: {html.escape(why)}")

    return image


def linked_figures(paths: Sequence[Path]) -> str:
    """Charts linked by relative path (``<figure><img src=...></figure>``), for a page that sits beside them."""
    return "".join(f'<figure><img src="{html.escape(str(p))}" alt="{html.escape(p.stem)}"></figure>' for p in paths)


# --------------------------------------------------------------------------------------------
# the page shell

STYLESHEET = """\
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
h2{margin-top:1.6em}
table.t,body.batch table{border-collapse:collapse;font-size:13px;table-layout:auto;max-width:100%;margin:8px 0 16px}
table.t td,table.t th,body.batch td,body.batch th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;
word-break:normal;overflow-wrap:break-word;hyphens:none}
table.t th,body.batch th{white-space:normal;background:#fafafa}
table.t td.tok,body.batch td.tok{white-space:nowrap}
table.t td.num,body.batch td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.finding{font-size:16px;background:#f1f8e9;border-left:4px solid #558b2f;padding:6px 10px}
.sign{color:#555;font-size:13px}
img{max-width:100%;border:1px solid #eee}
.data{padding:8px 12px;border-radius:4px;font-size:15px}
.data.simulated{background:#fff3e0;border:2px solid #ef6c00}
.data.real{background:#e8f5e9;border:2px solid #2e7d32}
.data.toy,.banner.toy{background:#fce4ec;border:2px solid #ad1457}
.banner{background:#fff3e0;border:1px solid #ff8f00;padding:.6em 1em}
.left-out{background:#ffebee;border:2px solid #c62828;padding:6px 10px;border-radius:4px}
pre{background:#f5f5f5;padding:8px;overflow:auto;white-space:pre-wrap}
figure{display:inline-block;margin:8px}
body.batch{max-width:1400px}
body.batch table{border-color:#ccc}
body.batch p.data{background:#fff3e0;border:2px solid #ef6c00;font-size:inherit}
body.batch img{max-width:640px}
tr.group th{text-align:left;white-space:nowrap;background:#fce4ec;color:#ad1457}
tr.ok td:nth-child(2){color:#2e7d32}
tr.failed td:nth-child(2){color:#c62828;font-weight:bold}
tr.missing td:nth-child(2){color:#777}
table.metrics tr td:nth-child(2){color:inherit;font-weight:normal}
"""
PAGE_KINDS = ("report", "billing", "batch", "audit")


def html_page(page_title: str, body: Sequence[str], kind: str) -> str:
    """A self-contained page: ``<title>`` (escaped here), the one :data:`STYLESHEET` and ``body`` (HTML parts,
    already escaped) inside ``<body class="kind">``; ``kind`` is one of :data:`PAGE_KINDS`. Control characters
    (a provider name's BEL or ESC) are written as visible ``\\xNN`` escapes (:func:`~kimi_eagle.apps.reports.
    safe_text.visible`)."""
    from kimi_eagle.apps.reports.safe_text import visible

    if kind not in PAGE_KINDS:
        raise ValueError(f"kind must be one of {PAGE_KINDS}, not {kind!r}")
    return visible("\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(page_title)}</title>",
        f"<style>\n{STYLESHEET}</style>",
        f"</head><body class='{kind}'>",
        *body,
        "</body></html>",
        "",
    ]))


def serving_evidence_html(lines: list[str] | None) -> list[str]:
    """The ``--serving auto`` choice per provider and its evidence, as a list under the profiles line."""
    if not lines:
        return []
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return [f"<div class='serving-evidence'><p>serving profile chosen per provider (--serving auto, "
            f"from the billed counts and the answers):</p><ul>{items}</ul></div>"]


PROVIDER_COLUMNS = ("provider", "scope", "chosen", "prompt", "completion", "residual", "records")


def provider_table_html(rows: list[dict] | None) -> list[str]:
    """The per-provider table of a ``--serving auto`` reconstruction (kimi_eagle.reconstruct.prepass
    ``provider_rows``): what was chosen for each provider and how, prompt and completion parity (billed counts equal
    to the reconstruction, calibrated or as evidence), the residual of what nothing explains; unexplained rows first
    and marked."""
    if not rows:
        return []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in PROVIDER_COLUMNS)
    body = "".join(
        f"<tr class='{'unexplained' if r['unexplained'] else 'explained'}'>"
        + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in PROVIDER_COLUMNS) + "</tr>" for r in rows)
    return ["<h2>Per provider: serving variant, prompt and completion parity</h2>",
            "<p>prompt and completion: records whose billed count equals the reconstruction (under the variant's "
            "count conventions) / records compared, from the provider table's calibration or the group's own "
            "evidence; residual: billed - reconstructed where the table explains nothing.</p>",
            f"<table class='providers'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"]
