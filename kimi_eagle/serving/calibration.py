"""Per-provider calibration from billed counts: which server-side variant explains a provider's ``usage``.

:class:`VariantCounts` gives a record's reconstructed prompt and completion counts under any
:class:`~kimi_eagle.serving.variants.Variant`, fast: the prompt splits at the special tokens around the tool
declaration (BPE never merges across a special token), so it is *the prompt without tools* (per profile and
system convention) plus *the tool declaration turn* (per tool schema and declaration text, cached by the tools'
JSON), plus an offset; the completion is reconstructed once per profile. :func:`fit_group` searches the space
for the variant that makes the most reconstructed counts equal the billed ones (prompt and completion, each
part exactly, since they only share the profile), ties broken by the simplest variant; :func:`calibrate`
does that for every (provider, model) group, on all its records (in sample) and on one half learned to score
the other half (held out, split by a hash of the record id). A side that the best variant leaves with fewer
than :data:`EXPLAINED` of its records equal is ``unexplained``, with the residual (billed − reconstructed).
"""
from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from dataclasses import dataclass, fields, replace
from itertools import product
from typing import Any, Callable, Iterable, Sequence

from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.records import RecordError, count_field
from kimi_eagle.serving.periods import (  # noqa: F401 (re-exported)
    day_of,
    deployment_of,
    in_period,
    period_end,
    period_label,
    period_of,
    scope,
)
from kimi_eagle.serving.profiles import get_profile
from kimi_eagle.serving.provider_table import EXPLAINED, REDACTED, redact
from kimi_eagle.serving.request import deep_sort, served_prompt_pieces
from kimi_eagle.serving.variants import (
    COMPLETION_DIMENSIONS,
    REASONING_KINDS,
    REST_DIMENSIONS,
    SCHEMAS,
    SPACE,
    Variant,
    chars_estimate,
    declaration,
    history_calls,
    spaced_extra,
    split_extra,
    tool_block,
    variant_prompt_pieces,
)
from kimi_eagle.tokenize.tokenizer import Tokenizer


def billed(record: dict, key: str) -> int | None:
    """``response.usage[key]`` as a count, None when absent or not a count."""
    usage = (record.get("response") or {}).get("usage")
    return count_field(usage.get(key)) if isinstance(usage, dict) else None


def has_tools(record: dict) -> bool:
    return bool((record.get("request") or {}).get("tools"))


# The reconstruction whose completion count calibration compares with the billed one: ``(record, profile,
# answer_text, format, encoder) -> row`` (``n_completion_tokens``, ``segments``). Reconstruction sits above
# serving, so it is handed in: :func:`kimi_eagle.reconstruct.record.rebuild_under`.
Rebuild = Callable[[dict, Any, str, Any, PieceEncoder], Any]


class VariantCounts:
    """Reconstructed counts of records under variants, cached per record and part (see the module); ``rebuild``
    reconstructs a record's completion under a profile (:data:`Rebuild`)."""

    def __init__(self, tok: Tokenizer, rebuild: Rebuild) -> None:
        self.tok, self.enc, self.rebuild = tok, PieceEncoder(tok), rebuild
        self._rest: dict[tuple, int | None] = {}
        self._tools: dict[tuple, int] = {}
        self._completion: dict[tuple, tuple[int, int] | None] = {}
        self._formats: dict[tuple, Any] = {}
        self._facts: dict[str, tuple] = {}  # per record id: what of it the rest dimensions can change
        self._tool_keys: dict[str, str] = {}  # per record id: its tools as JSON (the tool turn cache's key)
        self.fits: dict[tuple, Variant] = {}  # fit_group's answers, by the records' ids

    def _format(self, name: str, declaration_kind: str = "json") -> Any:
        key = (name, declaration_kind)
        if key not in self._formats:
            self._formats[key] = get_format(name, self.tok, declaration_kind)
        return self._formats[key]

    def _count(self, pieces: list, profile: Any) -> int:
        if profile.marker_text != "text":
            pieces = served_prompt_pieces(pieces, profile, self.tok.special_id_by_text)
        return len(self.enc.encode_marked(pieces)[0])

    def prompt_rest(self, record: dict, profile_name: str, rest: tuple) -> int | None:
        """The prompt without its tool declaration turn, ``rest`` the values of :data:`REST_DIMENSIONS` (None when
        the profile's server refuses the request or the template does not apply to the record's format)."""
        if record["id"] not in self._facts:
            self._facts[record["id"]] = _facts(record)
        key = (record["id"], profile_name, _effective(self._facts[record["id"]], rest))
        if key not in self._rest:
            profile = get_profile(profile_name)
            try:
                variant = Variant(profile=profile_name, **dict(zip(REST_DIMENSIONS, key[2])))
                messages = normalise_messages(record["request"].get("messages"))
                pieces = variant_prompt_pieces(messages, None, record["format"], variant, profile, self.tok)
                if pieces is None:
                    raise ValueError("template not applicable")
                self._rest[key] = self._count(pieces, profile)
            except (RecordError, KeyError, TypeError, ValueError, AttributeError):
                self._rest[key] = None
        return self._rest[key]

    def tool_turn(self, record: dict, profile_name: str, tools: str, schema: str, template: str = "format",
                  escape: str = "none") -> int:
        """The tool declaration turn's tokens (0 without tools)."""
        declared = (record.get("request") or {}).get("tools")
        if not declared:
            return 0
        if record["id"] not in self._tool_keys:
            self._tool_keys[record["id"]] = json.dumps(declared, sort_keys=False)
        key = (self._tool_keys[record["id"]], record["format"], profile_name, tools, schema, template, escape)
        if key not in self._tools:
            profile = get_profile(profile_name)
            shaped = SCHEMAS[schema](declared)
            if profile.sort_tools:
                shaped = deep_sort(shaped)
            text = declaration(shaped, tools, record["format"], profile.tool_declaration, template, escape)
            self._tools[key] = self._count(tool_block(text), profile)
        return self._tools[key]

    def _respaced(self, record: dict) -> int:
        """How many more tokens the answer's tool-call arguments take written with ``", "`` and ``": "``."""
        calls = [c.get("function") or {} for c in _calls(record) if isinstance(c, dict)]
        return sum(spaced_extra(self.tok, fn["arguments"]) for fn in calls if isinstance(fn.get("arguments"), str))

    def completion(self, record: dict, profile_name: str, answer_text: str = "as-served") -> tuple | None:
        """``(n_completion_tokens, reasoning tokens, whether the answer has tool calls, the extra tokens of its
        arguments written spaced, its chars-estimate count, its ids' extra tokens under ``call_header = functions-split``)`` under the profile's answer side after the
        ``answer_text`` convention (legacy answer sides only), None if it cannot be built or the server returned
        none of the answer (flag ``answer_empty``: its billed count says nothing of how the provider counts)."""
        key = (record["id"], profile_name, answer_text)
        if key not in self._completion:
            profile = get_profile(profile_name)
            try:
                if answer_text != "as-served" and profile.answer_rules != "legacy":
                    raise RecordError("an answer_text convention is for legacy answer sides only")
                row = self.rebuild(record, profile, answer_text, self._format(record["format"], profile.tool_declaration),
                                   self.enc)
                if "answer_empty" in row.flags:
                    raise RecordError("the server returned none of the answer")
                reasoning = sum(s["tok_end"] - s["tok_start"] for s in row.segments if s["kind"] in REASONING_KINDS)
                self._completion[key] = (row.n_completion_tokens, reasoning, _has_calls(record), self._respaced(record),
                                         self._estimate(record), split_extra(self.tok, _calls(record)))
            except RecordError:
                self._completion[key] = None
        return self._completion[key]

    def _estimate(self, record: dict) -> int:
        """The answer's ``tool_answer = chars-estimate`` count (its content as returned, its last call's arguments)."""
        calls = _calls(record)
        last = (calls[-1].get("function") or {}).get("arguments") if calls and isinstance(calls[-1], dict) else None
        message = ((record.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        content = message.get("content") if isinstance(message.get("content"), str) else None
        return chars_estimate(len(content or ""), len(self.tok.encode(last)) if isinstance(last, str) else 0)

    def prompt(self, record: dict, v: Variant) -> int | None:
        rest = self.prompt_rest(record, v.profile, tuple(getattr(v, d) for d in REST_DIMENSIONS))
        if rest is None:
            return None
        turn = self.tool_turn(record, v.profile, v.tools, v.schema, v.template, v.json_escape)
        return rest + turn + v.prompt_count_offset(record["request"])

    def completion_count(self, record: dict, v: Variant) -> int | None:
        got = self.completion(record, v.profile, v.answer_text)
        if got is None:
            return None
        n, reasoning, calls, respaced, estimate, split = got
        if calls and v.tool_answer == "chars-estimate":
            return estimate
        return (n - (reasoning if v.reasoning == "excluded" else 0) + v.completion_offset
                + (v.tool_call_offset if calls else 0) + (respaced if v.answer_args == "spaced" else 0)
                + (split if v.call_header == "functions-split" else 0))


def _facts(record: dict) -> tuple[bool, bool, bool, bool, bool]:
    """What of a record the rest dimensions can change: whether it starts with a system message, has earlier calls,
    reasoning details, a system or tool turn, a tool turn."""
    messages = (record.get("request") or {}).get("messages") or []
    roles = {m.get("role") for m in messages if isinstance(m, dict)}
    return (bool(messages) and isinstance(messages[0], dict) and messages[0].get("role") == "system",
            bool(history_calls(messages)), any(isinstance(m, dict) and m.get("reasoning_details") for m in messages),
            bool(roles & {"system", "tool"}), "tool" in roles)


def _effective(facts: tuple[bool, bool, bool, bool, bool], rest: tuple) -> tuple:
    """``rest`` (values of :data:`REST_DIMENSIONS`) with the values that cannot change a record of these
    :func:`_facts` set to their defaults: a request with a system message is rendered alike under every
    ``system``, one without earlier calls under every history value, one without reasoning details under every
    ``history_reasoning``, and the 0905 template's revisions only change its system and tool turns."""
    template, system, text, ids, args, content, reasoning, newline, result = rest
    starts_with_system, calls, details, system_or_tool, tool = facts
    plain = template != "k2-0905"
    return (template, "template" if starts_with_system else system, text if system_or_tool else "as-sent",
            ids if calls else "as-sent",
            args if calls else "as-sent", content if calls else "as-sent", reasoning if details else "as-sent",
            "none" if plain or not system_or_tool else newline, "template" if plain or not tool else result)


def _calls(record: dict) -> list:
    choices = (record.get("response") or {}).get("choices") or [{}]
    calls = (choices[0].get("message") or {}).get("tool_calls") if isinstance(choices[0], dict) else None
    return calls if isinstance(calls, list) else []


def _has_calls(record: dict) -> bool:
    return bool(_calls(record))


def _sub_variants(profile: str, dims: Sequence[str]) -> list[Variant]:
    out = [Variant(profile=profile)]
    for dim in dims:
        out = [replace(v, **{dim: value}) for v in out for value in SPACE[dim]]
    return sorted(out, key=Variant.cost)


def _deltas(counts: VariantCounts, records: Iterable[dict], v: Variant, kind: str) -> list[int | None]:
    """``billed - reconstructed`` per record with a billed ``kind`` count (None where nothing was reconstructed)."""
    out: list[int | None] = []
    for r in records:
        b = billed(r, f"{kind}_tokens")
        if b is None:
            continue
        got = counts.prompt(r, v) if kind == "prompt" else counts.completion_count(r, v)
        out.append(None if got is None else b - got)
    return out


TOOL_DIMENSIONS = ("tools", "schema", "json_escape")


def _simplest_first(dims: Sequence[str]) -> list[tuple]:
    """Every combination of the values of ``dims``, fewest non-default values first."""
    combos = product(*(SPACE[d] for d in dims))
    return sorted(combos, key=lambda c: (sum(SPACE[d].index(x) > 0 for d, x in zip(dims, c)),
                                         [SPACE[d].index(x) for d, x in zip(dims, c)]))


def _distinct(options: list[tuple], vector: Any) -> list[tuple[tuple, tuple]]:
    """``(option, vector(option))`` for the first (simplest) option of each distinct vector."""
    seen: dict[tuple, tuple] = {}
    for option in options:
        seen.setdefault(vector(option), option)
    return [(option, vec) for vec, option in seen.items()]


def _best_prompt(counts: VariantCounts, records: list[dict], profile: str) -> tuple[int, Variant]:
    """:func:`_best_part` of the prompt side, fast: combinations giving the same counts on ``records`` are tried
    once (the simplest), and every offset is read off one count of the deltas."""
    rows = [(r, b, history_calls(r["request"].get("messages"))) for r in records
            if (b := billed(r, "prompt_tokens")) is not None]
    rests = _distinct(_simplest_first(REST_DIMENSIONS),
                      lambda rest: tuple(counts.prompt_rest(r, profile, rest) for r, _, _ in rows))
    best: tuple[int, tuple, Variant] | None = None
    tool_sets = {template: _distinct(_simplest_first(TOOL_DIMENSIONS), lambda tool, t=template: tuple(
        counts.tool_turn(r, profile, tool[0], tool[1], t, tool[2]) for r, _, _ in rows)) for template in {rest[0] for rest, _ in rests}}
    for rest, rest_counts in rests:
        for (tool, tool_counts), per_call, per_turn in product(tool_sets[rest[0]], SPACE["history_call_offset"],
                                                               SPACE["tool_turn_offset"]):
            deltas = Counter(b - n - t - (per_turn if t else 0) - per_call * calls
                             for (_, b, calls), n, t in zip(rows, rest_counts, tool_counts) if n is not None)
            for offset in SPACE["prompt_offset"]:
                equal = deltas.get(offset, 0)
                if best is not None and equal < best[0]:
                    continue
                v = Variant(profile=profile, **dict(zip(REST_DIMENSIONS, rest)), **dict(zip(TOOL_DIMENSIONS, tool)),
                            prompt_offset=offset, history_call_offset=per_call, tool_turn_offset=per_turn)
                if best is None or (equal, tuple(-x for x in _flat(v.cost()))) > best[:2]:
                    best = (equal, tuple(-x for x in _flat(v.cost())), v)
    assert best is not None
    return best[0], best[2]


def _flat(cost: tuple[int, tuple[int, ...]]) -> tuple[int, ...]:
    return (cost[0], *cost[1])


def _best_part(counts: VariantCounts, records: list[dict], profile: str, kind: str) -> tuple[int, Variant]:
    """The most equal records of one side under ``profile``, and the simplest sub-variant reaching it."""
    if kind == "prompt":
        return _best_prompt(counts, records, profile)
    best: tuple[int, Variant] | None = None
    for v in _sub_variants(profile, COMPLETION_DIMENSIONS):
        equal = sum(d == 0 for d in _deltas(counts, records, v, kind))
        if best is None or equal > best[0]:
            best = (equal, v)
    assert best is not None
    return best


def fit_group(counts: VariantCounts, records: list[dict], profiles: Sequence[str] | None = None) -> Variant:
    """The variant under which the most of ``records`` have both counts equal to the billed ones, simplest first."""
    key = (tuple(r["id"] for r in records), tuple(profiles or ()))
    if key not in counts.fits:
        counts.fits[key] = _fit(counts, records, profiles)
    return counts.fits[key]


def _fit(counts: VariantCounts, records: list[dict], profiles: Sequence[str] | None) -> Variant:
    best: tuple[int, tuple, Variant] | None = None
    for profile in profiles or SPACE["profile"]:
        p_equal, pv = _best_part(counts, records, profile, "prompt")
        c_equal, cv = _best_part(counts, records, profile, "completion")
        v = replace(pv, **{f.name: getattr(cv, f.name) for f in fields(Variant) if f.name in COMPLETION_DIMENSIONS})
        key = (-(p_equal + c_equal), v.cost())
        if best is None or key < best[:2]:
            best = (*key, v)
    assert best is not None
    return best[2]


def held_out(record_id: str) -> bool:
    """The deterministic half a record belongs to: True for the held-out half (sha256 of the id, even/odd)."""
    return hashlib.sha256(record_id.encode()).digest()[0] % 2 == 1


@dataclass
class Side:
    """One side's figures under a variant: equal / compared and the residual (billed − reconstructed)."""

    equal: int
    compared: int
    median: float | None
    low: int | None
    high: int | None

    @classmethod
    def of(cls, deltas: list[int | None]) -> "Side":
        known = [d for d in deltas if d is not None]
        return cls(sum(d == 0 for d in known), len(deltas), statistics.median(known) if known else None,
                   min(known) if known else None, max(known) if known else None)

    @property
    def explained(self) -> bool:
        return self.compared == 0 or self.equal >= EXPLAINED * self.compared

    def residual(self) -> str:
        if self.median is None:
            return "-"
        return f"median {self.median:+g} (range {self.low:+d}..{self.high:+d})"


# --------------------------------------------------------------------------------------------
# Groups, periods, in-sample and held-out figures

def _equal(counts: VariantCounts, records: list[dict], v: Variant) -> int:
    return sum(d == 0 for kind in ("prompt", "completion") for d in _deltas(counts, records, v, kind))


def _periods(counts: VariantCounts, records: list[dict]) -> list[tuple[str, list[dict]]]:
    """The group's records as one period (``all``), or split in time where the server changed: the records' days
    (``response.created``) in order, each fitted apart, then the two neighbouring runs whose merge loses the fewest
    equal counts merged, again and again, while a merge loses fewer than two (a split must make at least two more
    counts equal than one variant for both runs: a run is never kept for one record's sake). Periods are labelled
    by month where a run's neighbours lie in other months, by day where a server changed mid-month
    (:func:`~kimi_eagle.serving.periods.period_label`). Undated records join the last run (the latest period, where
    they are looked up)."""
    days: dict[str, list[dict]] = {}
    for r in records:
        days.setdefault(day_of(r), []).append(r)
    undated = days.pop("undated", [])  # looked up in the latest period: they join the last run
    whole = [("all", records)]
    if len(days) < 2:
        return whole
    runs = [list(rs) for _, rs in sorted(days.items())]
    runs[-1] += undated

    def own(rs: list[dict]) -> int:
        return _equal(counts, rs, fit_group(counts, rs))

    while len(runs) > 1:
        losses = [own(a) + own(b) - own(a + b) for a, b in zip(runs, runs[1:])]
        i = min(range(len(losses)), key=lambda k: (losses[k], len(runs[k]) + len(runs[k + 1])))
        if losses[i] >= 2:
            break
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
    if len(runs) < 2:
        return whole
    spans = [sorted({day_of(r) for r in rs} - {"undated"}) for rs in runs]
    return [(period_label(span, spans[k - 1][-1] if k else None, spans[k + 1][0] if k + 1 < len(spans) else None), rs)
            for k, (span, rs) in enumerate(zip(spans, runs))]


def _deployments(counts: VariantCounts, records: list[dict]) -> list[tuple[str, list[dict]]]:
    """The period's records as one deployment (``any``), or split by the family of their ``system_fingerprint``
    (:func:`~kimi_eagle.serving.periods.deployment_of`) where each family is fitted apart and the split makes
    at least two more counts equal than one variant for all (Novita behind OpenRouter: two servers in one month)."""
    families: dict[str, list[dict]] = {}
    for r in records:
        families.setdefault(deployment_of(r), []).append(r)
    if len(families) < 2:
        return [("any", records)]
    split = sum(_equal(counts, rs, fit_group(counts, rs)) for rs in families.values())
    if split < _equal(counts, records, fit_group(counts, records)) + 2:
        return [("any", records)]
    return sorted(families.items())


def _figures(counts: VariantCounts, records: list[dict], v: Variant) -> dict[str, Side]:
    return {kind: Side.of(_deltas(counts, records, v, kind)) for kind in ("prompt", "completion")}


# The evidence rule: an entry is ``explained`` only when its variant makes at least EXPLAINED of each side equal in
# sample, on at least MIN_RECORDS billed records a side, the variant learned on the learning half scores at least
# EXPLAINED of each side of the held-out half (at least MIN_HELD_OUT records a side), and every constant offset it
# uses is produced by a named mechanism (variants.MECHANISMS). An entry whose sides are explained in sample but that
# misses any of these is ``thin``: ``--serving auto`` renders its records with the best variant and flags them
# ``provider_table_thin``. Otherwise it is ``unexplained``.
MIN_RECORDS = 10
MIN_HELD_OUT = 3
STATUS_RULE = (f"explained: each side >= {EXPLAINED:.0%} equal in sample on >= {MIN_RECORDS} billed records, the "
               f"variant learned on the other half >= {EXPLAINED:.0%} equal on the held-out half (>= {MIN_HELD_OUT} "
               "records a side), and every constant offset produced by a named mechanism; thin: explained in sample "
               "but short of that; unexplained: a side under the share")

# Which half a record is in: True for the held-out half (default: :func:`held_out`, a hash of the id).
Split = Callable[[dict], bool]


def evidence_status(inside: dict[str, Side], outside: dict[str, Side], v: Variant) -> tuple[str, list[str]]:
    """``(status, reasons)``: ``explained``, ``thin`` (reasons: what the evidence lacks) or ``unexplained`` (reasons:
    the sides under the share) under :data:`STATUS_RULE`."""
    unexplained = [kind for kind, side in inside.items() if not side.explained]
    if unexplained:
        return "unexplained", unexplained
    short = [f"{kind} rests on {side.compared} record(s) (< {MIN_RECORDS})" for kind, side in inside.items()
             if side.compared < MIN_RECORDS]
    short += [f"held-out {kind} {side.equal}/{side.compared}" for kind, side in outside.items()
              if side.compared < MIN_HELD_OUT or not side.explained]
    short += [f"offset {o} has no named mechanism" for o in v.unnamed_offsets()]
    return ("thin" if short else "explained"), short


def calibrate_period(counts: VariantCounts, provider: str, model: str, period: str, records: list[dict],
                     deployment: str = "any", split: Split | None = None) -> dict:
    """One row of the provider table: the variant fitted on all ``records`` with its in-sample figures, the
    variant fitted on the learning half scored on the held-out half (``split``), and its status under
    :data:`STATUS_RULE` (``reasons``: what makes it thin or unexplained)."""
    split = split or (lambda r: held_out(r["id"]))
    v = fit_group(counts, records)
    learn = [r for r in records if not split(r)]
    test = [r for r in records if split(r)]
    learned = fit_group(counts, learn) if learn else Variant()
    inside, outside = _figures(counts, records, v), _figures(counts, test, learned)
    status, reasons = evidence_status(inside, outside, v)
    return {"provider": provider, "model": model, "period": period, "deployment": deployment,
            "records": len(records), "variant": v,
            "in_sample": inside, "held_out": outside, "held_out_variant": learned,
            "status": status, "reasons": reasons, "unexplained": reasons if status == "unexplained" else [],
            "tools": {flag: _figures(counts, [r for r in records if has_tools(r) == flag], v) for flag in (False, True)}}


def group_key(r: dict) -> tuple[str, str]:
    """(provider, model) of a record, the API key replaced by a marker where a field holds it (:func:`key_in_data`)."""
    response = r.get("response") or {}
    return (redact(str(response.get("provider") or "unknown"))[0],
            redact(str(response.get("model") or r.get("format") or "unknown"))[0])


def key_in_data(r: Any) -> bool:
    """Whether the record's ``response.provider`` or ``response.model`` holds the API key (flag ``api_key_in_data``)."""
    response = r.get("response") if isinstance(r, dict) else None
    fields = [str(response.get(k) or "") for k in ("provider", "model")] if isinstance(response, dict) else []
    return any(redact(f)[1] or REDACTED in f for f in fields)  # the key, or the marker a converter put in its place


def usable(r: Any) -> str | None:
    """Why a record cannot be calibrated (None when it can)."""
    if not isinstance(r, dict):
        return "not a record"
    if r.get("error"):
        return str(r["error"])[:200]
    if not isinstance(r.get("request"), dict):
        return "no request"
    return None


def calibrate(records: Iterable[dict], counts: VariantCounts, split: Split | None = None) -> list[dict]:
    """:func:`calibrate_period` of every (provider, model, period) of ``records`` (the kit's API records, with
    ``response.provider``; records with an ``error`` are left out: :func:`account` says which), sorted by provider,
    model and period."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if usable(r) is None:
            groups.setdefault(group_key(r), []).append(r)
    rows = []
    for (provider, model), members in sorted(groups.items()):
        for period, rs in _periods(counts, members):
            for deployment, ds in _deployments(counts, rs):
                rows.append(calibrate_period(counts, provider, model, period, ds, deployment, split))
    return rows


def screen(records: Iterable[Any], counts: VariantCounts) -> tuple[list[dict], Counter]:
    """``(the records calibration can use, Counter of why each other one is refused)``: a record is refused when it
    is no API record with a request, or when rendering or counting it under the default variant raises anything (one
    record never aborts a log). Every record is one or the other."""
    ok, left = [], Counter()
    for r in records:
        reason = usable(r)
        if reason is None:
            try:
                counts.prompt(r, Variant())
                counts.completion_count(r, Variant())
            except Exception as e:  # noqa: BLE001 - a record the checks did not foresee is refused, not fatal
                reason = f"unexpected {type(e).__name__}: {e}"[:200]
        if reason is None:
            ok.append(r)
        else:
            left[reason] += 1
    return ok, left


def score(counts: VariantCounts, rows: list[dict], records: Iterable[dict]) -> dict[str, tuple[int, int]]:
    """Out of sample: ``records`` scored under the variants of ``rows`` (learned on other records), each record
    under its group's row (its provider, model, period and deployment; a group the rows lack counts as compared
    and not equal). ``{"prompt_tools", "prompt_no_tools", "completion"}`` -> (equal, compared)."""
    out = {"prompt_no_tools": [0, 0], "prompt_tools": [0, 0], "completion": [0, 0]}
    for r in records:
        if usable(r) is not None:
            continue
        row = row_for(rows, r)
        for kind, name in (("prompt", "prompt_tools" if has_tools(r) else "prompt_no_tools"), ("completion", "completion")):
            deltas = _deltas(counts, [r], row["variant"], kind) if row else [None] * (billed(r, f"{kind}_tokens") is not None)
            out[name][0] += sum(d == 0 for d in deltas)
            out[name][1] += len(deltas)
    return {k: (v[0], v[1]) for k, v in out.items()}


def row_for(rows: list[dict], record: dict) -> dict | None:
    """The calibrated row a record falls in: its provider and model, the period holding its day (else the latest),
    its fingerprint family (else ``any``)."""
    provider, model = group_key(record)
    mine = [r for r in rows if r["provider"] == provider and r["model"] == model]
    day = day_of(record)
    mine = [r for r in mine if day != "undated" and in_period(day, r["period"])] or mine
    if mine:  # the period first (the record's day's, else the latest), then its fingerprint family within it
        latest = max(period_end(r["period"]) for r in mine)
        mine = [r for r in mine if period_end(r["period"]) == latest]
    family = deployment_of(record)
    mine = [r for r in mine if r.get("deployment", "any") == family] or [r for r in mine if r.get("deployment", "any") == "any"] or mine
    return mine[0] if mine else None


def residuals(counts: VariantCounts, rows: list[dict], records: Iterable[dict]) -> list[dict]:
    """Per provider and request size (billed prompt tokens: < 4k, 4k-8k, 8k-16k, >= 16k), the prompt and completion
    residuals (billed − reconstructed) under each record's row: ``provider``, ``size``, ``n``, ``prompt`` and
    ``completion`` (Counter of residuals)."""
    out: dict[tuple[str, str], dict] = {}
    for r in records:
        row = row_for(rows, r) if usable(r) is None else None
        if row is None:
            continue
        size = _size(billed(r, "prompt_tokens"))
        cell = out.setdefault((row["provider"], size), {"provider": row["provider"], "size": size, "n": 0,
                                                          "prompt": Counter(), "completion": Counter()})
        cell["n"] += 1
        for kind in ("prompt", "completion"):
            for d in _deltas(counts, [r], row["variant"], kind):
                cell[kind]["n/a" if d is None else d] += 1
    return [out[k] for k in sorted(out, key=lambda k: (k[0], SIZES.index(k[1])))]


SIZES = ("< 4k", "4k-8k", "8k-16k", ">= 16k", "unbilled")


def _size(n: int | None) -> str:
    if n is None:
        return "unbilled"
    return SIZES[0] if n < 4000 else SIZES[1] if n < 8000 else SIZES[2] if n < 16000 else SIZES[3]


def distribution(c: Counter) -> str:
    """A residual Counter as ``0 x12, -1 x3, +415 x2`` (most common first, at most six values)."""
    if not c:
        return "-"
    parts = [f"{k if isinstance(k, str) else f'{k:+d}'} x{n}" for k, n in c.most_common(6)]
    rest = sum(c.values()) - sum(n for _, n in c.most_common(6))
    return ", ".join(parts) + (f", others x{rest}" if rest else "")


TOTAL_NAMES = ("prompt_no_tools", "prompt_tools", "completion", "held_out_prompt", "held_out_completion")


def totals(rows: Iterable[dict]) -> dict[str, tuple[int, int]]:
    """Corpus totals (equal, compared): prompts without and with tools, completions; in sample and held out."""
    out: dict[str, list[int]] = {name: [0, 0] for name in TOTAL_NAMES}  # every total, zero without rows
    for row in rows:
        for name, side in (("prompt_no_tools", row["tools"][False]["prompt"]),
                           ("prompt_tools", row["tools"][True]["prompt"]),
                           ("completion", row["in_sample"]["completion"]),
                           ("held_out_prompt", row["held_out"]["prompt"]),
                           ("held_out_completion", row["held_out"]["completion"])):
            acc = out.setdefault(name, [0, 0])
            acc[0] += side.equal
            acc[1] += side.compared
    return {k: (v[0], v[1]) for k, v in out.items()}


# --------------------------------------------------------------------------------------------
# The provider table as text: unexplained providers first, then the explained ones, then the corpus totals

STATUS_ORDER = ("unexplained", "thin", "explained")
HEADER = ("provider", "model", "period", "n", "variant", "prompt", "completion", "held-out prompt",
          "held-out completion", "residual")


def _pair(side: Side) -> str:
    return f"{side.equal}/{side.compared}"


def _pct(pair: tuple[int, int]) -> str:
    equal, compared = pair
    return f"{equal}/{compared} ({100 * equal / compared:.1f}%)" if compared else "0/0"


def table_rows(rows: Iterable[dict]) -> list[tuple[str, ...]]:
    """One tuple of cells per calibrated row, unexplained rows first (each naming its residual)."""
    ordered = sorted(rows, key=lambda r: (STATUS_ORDER.index(r["status"]), r["provider"], r["model"], r["period"]))
    out = []
    for r in ordered:
        inside, outside = r["in_sample"], r["held_out"]
        residual = "; ".join(f"{kind} {inside[kind].residual()}" for kind in r["unexplained"])
        variant = r["variant"].describe() if r["status"] == "explained" else \
            f"{r['status'].upper()} (best: {r['variant'].describe()})"
        if r["status"] == "thin":
            residual = "thin: " + "; ".join(r.get("reasons", []))
        out.append((r["provider"], r["model"], scope(r["period"], r.get("deployment", "any")), str(r["records"]), variant, _pair(inside["prompt"]),
                    _pair(inside["completion"]), _pair(outside["prompt"]), _pair(outside["completion"]),
                    residual or "-"))
    return out


COLUMN_KEY = ("columns: n = the group's records; variant = the server-side variant that explains the most billed counts; "
              "prompt, completion = records whose billed count equals the reconstruction under it (equal/compared); "
              "held-out = learned on one half of the group, scored on the other; residual = billed - reconstructed "
              "where they differ")


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
    thin = [f"{r['provider']} ({r['model']}, {scope(r['period'], r.get('deployment', 'any'))}, {r['records']} records)"
            for r in rows if r["status"] == "thin"]
    if thin:
        lines.append(f"thin evidence (rendered with the best variant, rows flagged provider_table_thin): {'; '.join(thin)}")
    lines.append(f"rule: {STATUS_RULE}")
    lines.append(COLUMN_KEY)
    if skipped:
        lines.append(f"{skipped} record(s) left out (not an API record, no request, or no known chat format)")
    return "\n".join(lines)
