"""The provider table as text: unexplained providers first, then the explained ones, then the corpus totals."""
from __future__ import annotations

from typing import Iterable

from kimi_eagle.reconstruct.calibration import Side, totals
from kimi_eagle.reconstruct.periods import scope

HEADER = ("provider", "model", "period", "n", "variant", "prompt", "completion", "held-out prompt",
          "held-out completion", "residual")


def _pair(side: Side) -> str:
    return f"{side.equal}/{side.compared}"


def _pct(pair: tuple[int, int]) -> str:
    equal, compared = pair
    return f"{equal}/{compared} ({100 * equal / compared:.1f}%)" if compared else "0/0"


def table_rows(rows: Iterable[dict]) -> list[tuple[str, ...]]:
    """One tuple of cells per calibrated row, unexplained rows first (each naming its residual)."""
    ordered = sorted(rows, key=lambda r: (r["status"] != "unexplained", r["provider"], r["model"], r["period"]))
    out = []
    for r in ordered:
        inside, outside = r["in_sample"], r["held_out"]
        residual = "; ".join(f"{kind} {inside[kind].residual()}" for kind in r["unexplained"])
        variant = r["variant"].describe() if r["status"] == "explained" else f"UNEXPLAINED (best: {r['variant'].describe()})"
        out.append((r["provider"], r["model"], scope(r["period"], r.get("deployment", "any")), str(r["records"]), variant, _pair(inside["prompt"]),
                    _pair(inside["completion"]), _pair(outside["prompt"]), _pair(outside["completion"]),
                    residual or "-"))
    return out


def table_text(rows: list[dict], skipped: int = 0) -> str:
    """A markdown table of :func:`table_rows` and the totals against the issue's targets."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    t = totals(rows)
    lines += ["", f"prompts equal to billed: without tools {_pct(t['prompt_no_tools'])} (target 98%), "
                  f"with tools {_pct(t['prompt_tools'])} (target 90%)",
              f"completions equal to billed {_pct(t['completion'])} (target: unexplained <= 2%)",
              f"held out (learned on the other half of each group): prompts {_pct(t['held_out_prompt'])}, "
              f"completions {_pct(t['held_out_completion'])}"]
    unexplained = [f"{r['provider']} ({r['model']}, {scope(r['period'], r.get('deployment', 'any'))})" for r in rows
                   if r["status"] == "unexplained"]
    if unexplained:
        lines.append(f"unexplained by any variant: {'; '.join(unexplained)}")
    if skipped:
        lines.append(f"{skipped} record(s) left out (not an API record, no request, or no known chat format)")
    return "\n".join(lines)
