"""``kimi-eagle audit``: does each API provider return what the model itself would produce?

    kimi-eagle audit PROMPTS -o DIR --base-url URL --model M --providers A,B,C [--reference ENGINE.jsonl] [--repeats K]

For every prompt line (the collector's prompt format) and every provider, ``--repeats`` greedy completions are
requested (``temperature 0``, a fixed ``seed``, ``provider: {"only": [X], "allow_fallbacks": false}``) through
``kimi_eagle.apps.api.collect`` — its retries, rate-limit handling, resume and key handling (``OPENROUTER_API_KEY``,
redacted everywhere) included — into ``DIR/api/<provider>.jsonl``; each file is reconstructed
(``kimi_eagle.reconstruct.job``) into ``DIR/recon/<provider>.parquet``; and the completions are compared by the
diff stage's byte-level classifier (``kimi_eagle.apps.audit.compare``).

Outputs (all written atomically): ``completions.parquet`` — one row per prompt × provider × repeat, ``ok`` or
``error`` with the stage that failed and why (a bad prompt line, a collection error, a reconstruction error),
so nothing goes unaccounted; ``pairs.parquet`` — every comparison (provider pairs, provider vs reference, repeat
vs repeat 0); ``hunks.parquet`` — the first hunks of every divergent comparison (the evidence);
``summary.json`` — the agreement matrix, self-consistency, first-divergence distributions, and the providers
ranked by how often and how early they diverge; ``agreement_matrix.png``, ``first_divergence_cdf.png``,
``self_consistency.png`` and ``report.html`` — its charts and page (``kimi_eagle.apps.audit.report``). Rerunning the same command resumes: finished requests are kept.

Exit codes: 0 every request answered (ok or a permanent error), 1 some requests exhausted their retries,
3 a provider rejected the key (401/402: the audit stops), 2 bad input.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kimi_eagle.apps.audit.compare import REFERENCE, Completion, compare_all, summarize
from kimi_eagle.apps.audit.report import write_audit_report
from kimi_eagle.apps.reports.outputs import write_summary_tables
from kimi_eagle.data_kinds import provider_kind
from kimi_eagle.io import atomic_path, read_jsonl, write_json, write_jsonl

REPEAT_SEP = "#r"  # audit request id = prompt id + "#r" + repeat


def audit_request(body: dict[str, Any], provider: str, seed: int, max_tokens: int | None) -> dict[str, Any]:
    """``body`` made greedy, seeded and pinned to ``provider`` with no fallbacks (``max_tokens`` only if unset)."""
    out = {**body, "temperature": 0, "seed": seed, "provider": {"only": [provider], "allow_fallbacks": False}}
    if max_tokens is not None and out.get("max_tokens") is None and out.get("max_completion_tokens") is None:
        out["max_tokens"] = max_tokens
    return out


def read_prompts(path: str | Path, model: str) -> list[tuple[str, dict | None, str | None]]:
    """``(prompt id, request body or None, error or None)`` for every line of ``path``, in order, none dropped:
    unreadable lines, lines without messages and repeated ids (the first valid one wins) are errors."""
    from kimi_eagle.apps.api.collect import build_request

    out: list[tuple[str, dict | None, str | None]] = []
    seen: dict[str, int] = {}
    for line in read_jsonl(path):
        obj = line.obj
        given = obj.get("id") if isinstance(obj, dict) else None
        pid = str(given) if isinstance(given, (str, int)) and not isinstance(given, bool) else f"<line {line.lineno}>"
        try:
            if line.error:
                raise ValueError(line.error)
            if not isinstance(obj, dict):
                raise ValueError("prompt line is not a JSON object")
            if REPEAT_SEP in pid:
                raise ValueError(f"prompt id {pid!r} contains {REPEAT_SEP!r}, which the audit uses for repeats")
            if pid in seen:
                raise ValueError(f"duplicate id {pid!r} (first at line {seen[pid]})")
            body = build_request(obj, model, {})
            seen[pid] = line.lineno
            out.append((pid, body, None))
        except (ValueError, TypeError) as e:
            if pid in seen or any(p == pid for p, _, _ in out):
                pid = f"{pid} <line {line.lineno}>"
            out.append((pid, None, f"line {line.lineno}: {e}"))
    if not out:
        raise ValueError(f"{path}: no prompt lines")
    return out


def _api_outcomes(path: Path) -> dict[str, dict]:
    return {str(line.obj.get("id")): line.obj for line in read_jsonl(path) if isinstance(line.obj, dict)} \
        if path.exists() else {}


def gather_completions(prompts: Sequence[tuple[str, dict | None, str | None]], providers: Sequence[str], repeats: int,
                       api_dir: Path, recon_dir: Path) -> list[Completion]:
    """One ``Completion`` per prompt × provider × repeat from the stored API records and reconstructions."""
    from kimi_eagle.reconstruct.job import read_rows

    out: list[Completion] = []
    for provider in providers:
        api = _api_outcomes(api_dir / f"{provider}.jsonl")
        recon_path = recon_dir / f"{provider}.parquet"
        recon = {str(r["id"]): r for r in read_rows(recon_path).to_dict("records")} if recon_path.exists() else {}
        for pid, body, error in prompts:
            for r in range(repeats):
                rid = f"{pid}{REPEAT_SEP}{r}"
                c = Completion(pid, provider, r, "error")
                rec, row = api.get(rid), recon.get(rid)
                if body is None:
                    c.stage, c.error = "input", error
                elif rec is None:
                    c.stage, c.error = "collect", "no API record (the collection stopped before this request)"
                elif rec.get("status") != "ok":
                    err = rec.get("error") or {}
                    c.stage, c.error = "collect", f"{err.get('kind')}: {err.get('message')}"[:300]
                elif row is None:
                    c.stage, c.error = "reconstruct", "no reconstructed row"
                elif row.get("status") != "ok":
                    c.stage, c.error = "reconstruct", str(row.get("error"))[:300]
                else:
                    c.status, c.ids = "ok", [int(i) for i in row["completion_ids"]]
                    c.segments = [dict(s) for s in row.get("segments") if s is not None] \
                        if row.get("segments") is not None else []
                    c.finish_reason = row.get("finish_reason")
                out.append(c)
    return out


def read_reference(path: str | Path, tok: Any, prompt_ids: Sequence[str]) -> dict[str, Completion]:
    """The reference engine's completion of each prompt id (engine records; a missing or bad one is an error)."""
    from kimi_eagle.diff.run import read_engine

    entries = read_engine(path, tok)
    out = {}
    for pid in prompt_ids:
        e = entries.get(pid)
        if e is None:
            out[pid] = Completion(pid, REFERENCE, 0, "error", "reference", "no engine record with this id")
        elif e.error:
            out[pid] = Completion(pid, REFERENCE, 0, "error", "reference", e.error)
        else:
            out[pid] = Completion(pid, REFERENCE, 0, "ok", ids=list(e.output_ids), finish_reason=e.finish_reason)
    return out


def _write_parquet(rows: list[dict], path: Path, columns: Sequence[str]) -> None:
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(columns))
    for col in INTEGER_COLUMNS.intersection(df.columns):  # whole numbers even beside a missing one: token 9, never 9.0
        df[col] = df[col].astype("Int64")
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


INTEGER_COLUMNS = frozenset({"repeat", "n_tokens", "first_divergence", "len_a", "len_b", "length_diff", "n_hunks", "hunk",
                             "a_tok_start", "a_tok_end", "b_tok_start", "b_tok_end"})  # token positions and counts
COMPLETION_COLUMNS = ("prompt_id", "provider", "repeat", "status", "stage", "error", "n_tokens", "finish_reason", "ids")
PAIR_COLUMNS = ("prompt_id", "kind", "a", "b", "repeat", "status", "error", "identical", "verdict", "label",
                "first_divergence", "len_a", "len_b", "length_diff", "n_hunks")
HUNK_COLUMNS = ("prompt_id", "a", "b", "hunk", "kind", "subclass", "a_tok_start", "a_tok_end", "b_tok_start",
                "b_tok_end", "a_ids", "b_ids", "a_bytes", "b_bytes")


@dataclass(frozen=True)
class AuditOptions:
    """What ``kimi-eagle audit`` asks each provider and how it reads the answers.

    ``providers``: the provider names to route to (distinct, not the reference's name); ``reference``: engine records
    of the same prompts (the model's own IDs), or None; ``repeats``: requests per prompt and provider (greedy, so any
    difference between repeats is the provider's); ``serving``: the serving profile answers are reconstructed with
    (``template``, ``moonshot``, ``vllm``, ``sglang``: :mod:`kimi_eagle.serving.request`)."""

    base_url: str
    model: str
    providers: tuple[str, ...]
    reference: str | Path | None = None
    repeats: int = 2
    seed: int = 0
    max_tokens: int | None = 64
    tokenizer_dir: str | Path | None = None
    format_name: str = "kimi-k2.5"
    concurrency: int = 4
    max_attempts: int = 8
    timeout: float = 120.0
    progress: bool = True
    serving: str = "template"

    def check(self) -> None:
        """Raise ValueError naming the setting a user got wrong."""
        names = list(self.providers)
        if not names or len({n.lower() for n in names}) != len(names) or REFERENCE in names:
            raise ValueError(f"--providers must name distinct providers (and not {REFERENCE!r}), got {names}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"--repeats must be >= 1, got {self.repeats!r}")
        if self.reference is not None and not Path(self.reference).is_file():
            raise ValueError(f"--reference {self.reference}: not a file")

    def settings(self, tokenizer_dir: str | Path) -> dict[str, Any]:
        """The settings block of ``summary.json``."""
        return {"base_url": self.base_url, "model": self.model, "seed": self.seed, "max_tokens": self.max_tokens,
                "temperature": 0, "format": self.format_name, "tokenizer": str(tokenizer_dir),
                "reference": str(self.reference) if self.reference is not None else None, "serving": self.serving}


def audit(prompts_path: str | Path, out_dir: str | Path, options: AuditOptions,
          api_key: str | None = None) -> dict[str, Any]:
    """Run the audit into ``out_dir`` (see the module docstring); returns ``summary.json``'s content.
    ``api_key``: sent to ``base_url`` (None: ``$OPENROUTER_API_KEY``; ``""``: none)."""
    from kimi_eagle.apps.api.collect import CollectConfig
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    options.check()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: the output must be a directory")
    config = CollectConfig(options.base_url, options.model, options.concurrency, options.max_attempts,
                           options.timeout, progress=options.progress)  # validated here
    tokenizer_dir = options.tokenizer_dir or kimi_dir()
    tok = load_tokenizer(tokenizer_dir)
    prompts = read_prompts(prompts_path, options.model)
    collected, aborted = _collect_providers(prompts, out, options, config, (tokenizer_dir, tok), api_key)
    providers = list(options.providers)
    completions = gather_completions(prompts, providers, options.repeats, out / "api", out / "recon")
    ref = (read_reference(options.reference, tok, [pid for pid, _, _ in prompts])
           if options.reference is not None else None)
    pairs, hunks = compare_all(tok, completions, providers, ref)
    _write_parquet([{**c.__dict__, "n_tokens": len(c.ids) if c.ids is not None else None}
                    for c in completions + list((ref or {}).values())], out / "completions.parquet", COMPLETION_COLUMNS)
    _write_parquet(pairs, out / "pairs.parquet", PAIR_COLUMNS)
    _write_parquet(hunks, out / "hunks.parquet", HUNK_COLUMNS)
    summary = summarize(pairs, providers, ref is not None)
    by_status: dict[str, int] = {}
    for c in completions:
        key = "ok" if c.status == "ok" else f"error:{c.stage}"
        by_status[key] = by_status.get(key, 0) + 1
    summary.update(prompts=len(prompts), bad_prompts=sum(body is None for _, body, _ in prompts),
                   repeats=options.repeats, requests=len(completions), completions=by_status, collect=collected,
                   requested=sum(c["requested"] for c in collected.values()), reused=_reused(collected),
                   aborted=aborted, settings=options.settings(tokenizer_dir),
                   data=provider_kind(options.base_url, options.model))  # local "providers" are stand-ins (#35)
    write_json(out / "summary.json", summary)
    write_summary_tables(summary, out / "summary.json")  # summary.md, summary.csv
    write_audit_report(summary, out)
    return summary


def _reused(collected: dict[str, Any]) -> dict[str, str]:
    """What a rerun kept of an earlier audit (:mod:`kimi_eagle.reuse`): the answered requests, over all providers."""
    from kimi_eagle.reuse import note_collect

    reused: dict[str, str] = {}
    note_collect(reused, "collect", {"prompts": sum(c["already_done"] + c["requested"] for c in collected.values()),
                                     "already_done": sum(c["already_done"] for c in collected.values())})
    return reused


def _collect_providers(prompts: list, out: Path, options: AuditOptions, config: Any, tokenizer: tuple[Any, Any],
                       api_key: str | None) -> tuple[dict[str, Any], str | None]:
    """Ask every provider every prompt ``repeats`` times and reconstruct its answers with the options' serving
    profile; returns the per-provider collect counts and why the run stopped (None when it did not)."""
    from kimi_eagle.apps.api.collect import collect
    from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
    from kimi_eagle.reconstruct.record import serving_options
    from kimi_eagle.serving.profiles import get_profile

    tokenizer_dir, tok = tokenizer
    profile = get_profile(options.serving)
    job = JobOptions(progress=False, completion=serving_options(profile), tool_declaration=profile.tool_declaration)
    collected: dict[str, Any] = {}
    for provider in options.providers:
        lines = [{"id": f"{pid}{REPEAT_SEP}{r}",
                  "request": audit_request(body, provider, options.seed, options.max_tokens)}
                 for pid, body, _ in prompts if body is not None for r in range(options.repeats)]
        write_jsonl(out / "prompts" / f"{provider}.jsonl", lines)
        api_path = out / "api" / f"{provider}.jsonl"
        if not lines:
            continue
        summary = collect(out / "prompts" / f"{provider}.jsonl", api_path, config, api_key=api_key)
        collected[provider] = {k: summary[k] for k in ("already_done", "requested", "ok", "permanent", "exhausted",
                                                       "bad_prompt", "retries")}
        if summary["aborted"]:
            return collected, f"{provider}: {summary['aborted']}"
        reconstruct_file(api_path, out / "recon" / f"{provider}.parquet", tokenizer_dir, options.format_name,
                         job, tokenizer=tok)
    return collected, None


def matrix_text(summary: dict[str, Any]) -> str:
    """The agreement matrix as a fixed-width table: identical share (k/n) per cell, self-consistency on the diagonal."""
    names = summary["names"]
    width = max(14, *(len(n) + 2 for n in names))
    lines = [" " * width + "".join(n.rjust(width) for n in names)]
    for a in names:
        cells = []
        for b in names:
            cell = summary["matrix"][a].get(b)
            cells.append((f"{cell['k']}/{cell['n']}" if cell else "-").rjust(width))
        lines.append(a.ljust(width) + "".join(cells))
    return "\n".join(lines)


# ---- command line
