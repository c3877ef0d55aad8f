"""``kimi-eagle providers``: per-provider calibration from billed counts: which server-side variant explains each provider.

Reads API records (the kit's shape, e.g. from ``kimi-eagle convert``; each record's ``format``, else the chat
format of its ``response.model``) or, with ``--recorded``, the recorded real exchanges of the assets
(``assets/data/real_api``: the toy-tool exchanges and the agent traces, each calibrated and reported on its own),
searches the declared space of server-side transformations (kimi_eagle/serving/variants.py) per provider, model and
period, and prints the table: the variant chosen, its status (explained, thin or unexplained, under the stated
evidence rule), prompt and completion parity in sample and held out, the residual of what nothing explains (listed
first), every record accounted for (calibrated, or refused with its reason), and the residual distributions by
provider and request size. The agent traces are also scored out of sample: learned on some of the agent's tests,
scored on the others. With both corpora (the default) they are also calibrated together: a provider's server renders
toy and real tools alike on a given day, so each period rests on both; that is the table ``-o/--write-table PATH``
writes as the TOML data file ``--serving auto`` reads (kimi_eagle/data/providers.toml is this command's output on
``--recorded``), scored out of sample on the agent's scored tests (learned on every other record).
"""
from __future__ import annotations

import argparse
import sys

from kimi_eagle.apps.cli import add_option


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="?", default=None, metavar="LOG",
                   help="API records (JSONL); omit with --recorded")
    p.add_argument("--recorded", action="store_true",
                   help="calibrate on the assets' recorded real exchanges (assets/data/real_api) instead of LOG")
    p.add_argument("--corpus", choices=("all", "real_api", "agent_traces"), default="all",
                   help="with --recorded: which corpus (default all: each reported on its own, then both calibrated "
                        "together: the table written, kimi_eagle/data/providers.toml)")
    add_option(p, "-o", "--output", "--write-table", dest="write_table", default=None,
               help="write the provider table (TOML) to this path (kimi_eagle/data/providers.toml format)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")


def _log_record(line) -> tuple[dict | None, str | None]:
    """One JSONL line as a calibratable record (its chat format set), or why it is left out (a usage that is not
    counts, such as a list, is named: its billed counts are what calibration compares)."""
    from kimi_eagle.reconstruct.log_shapes import LogShapeError, as_api_record
    from kimi_eagle.reconstruct.recorded import chat_format
    from kimi_eagle.reconstruct.usage import usage_count_problems
    from kimi_eagle.records import RecordError

    if line.error is not None:
        return None, line.error
    try:
        record = as_api_record(line.obj)
    except (LogShapeError, RecordError, ValueError, TypeError, KeyError, AttributeError) as e:
        return None, str(e)
    if not isinstance(record, dict) or not isinstance(record.get("request"), dict):
        return None, "not an API record with a request"
    usage = record["response"].get("usage") if isinstance(record.get("response"), dict) else None
    if problems := usage_count_problems(usage):
        return None, "; ".join(problems)
    fmt = record.get("format") or chat_format((record.get("response") or {}).get("model"))
    if fmt is None:
        return None, "no known chat format (no format field, response.model not a Kimi model)"
    return {**record, "format": fmt, "id": str(record.get("id", line.lineno))}, None


def _log_records(path: str) -> tuple[list[dict], list[str]]:
    """The usable records of a JSONL log, and one ``line N: reason`` for every line left out."""
    from kimi_eagle.io import read_jsonl

    records, left_out = [], []
    for line in read_jsonl(path):
        record, reason = _log_record(line)
        if record is None:
            left_out.append(reason if reason.startswith("line ") else f"line {line.lineno}: {reason}"[:200])
        else:
            records.append(record)
    return records, left_out


def _safe(text: str) -> str:
    """A line for the terminal: the API key redacted, control characters escaped."""
    from kimi_eagle.serving.provider_table import comment_safe, redact

    return "\n".join(comment_safe(line) for line in redact(text)[0].split("\n"))


def _accounting(name: str, total: int, ok: list, refused, flagged: int) -> list[str]:
    lines = [f"{name}: {total} record(s): {len(ok)} calibrated, {sum(refused.values())} refused"]
    lines += [f"  refused ({n}): {reason}" for reason, n in refused.most_common(20)]
    if flagged:
        lines.append(f"  {flagged} record(s) held the API key in response.provider or response.model: replaced by "
                     "a marker (flag api_key_in_data)")
    return lines


def calibrate_corpus(name: str, records: list[dict], counts, split=None, score_split=None) -> tuple[list[dict], str]:
    """Calibrate one corpus and its printed report: accounting, table, out of sample (``score_split``: record ->
    scored, learned on the others), residual distributions."""
    from kimi_eagle.serving.calibration import (
        calibrate,
        distribution,
        key_in_data,
        residuals,
        score,
        screen,
        table_text,
    )

    ok, refused = screen(records, counts)
    rows = calibrate(ok, counts, split)
    lines = [f"## {name}", "", *_accounting(name, len(records), ok, refused, sum(key_in_data(r) for r in ok)), "",
             table_text(rows, 0)]
    if score_split is not None:
        learn = [r for r in ok if not score_split(r)]
        test = [r for r in ok if score_split(r)]
        out = score(counts, calibrate(learn, counts), test)
        lines += ["", f"out of sample (learned on {len(learn)} records of some tests, scored on {len(test)} of the "
                      "others): " + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in out.items())]
    lines += ["", "residuals (billed - reconstructed) by provider and request size (billed prompt tokens):",
              "| provider | size | n | prompt | completion |", "|---|---|---|---|---|"]
    lines += [f"| {c['provider']} | {c['size']} | {c['n']} | {distribution(c['prompt'])} | "
              f"{distribution(c['completion'])} |" for c in residuals(counts, rows, ok)]
    return rows, "\n".join(lines)


def _recorded(args: argparse.Namespace, counts) -> list[tuple[str, list[dict]]]:
    """``--recorded``: each corpus calibrated and printed on its own; with ``--corpus all`` also both together (the
    table written), the agent's scored tests out of sample of it. ``[(source, rows)]``, the table to write first."""
    from kimi_eagle.reconstruct.recorded import AGENT_DATASET, CORPORA, corpus_records

    tables: list[tuple[str, list[dict]]] = []
    corpora = {}
    for dataset in CORPORA if args.corpus == "all" else (args.corpus,):
        exchanges, records = corpus_records(dataset)
        scored = _agent_scored(exchanges, records) if dataset == AGENT_DATASET else None
        corpora[dataset] = (records, scored)
        rows, text = calibrate_corpus(f"{dataset} ({CORPORA[dataset]})", records, counts, scored, scored)
        print(_safe(text) + "\n")
        tables.append((f"the recorded exchanges (assets/data/{CORPORA[dataset]})", rows))
    if len(corpora) > 1:  # the shipped table: every recorded exchange, toy tools and the agent's real ones
        rows, text = calibrate_both(corpora, counts)
        print(_safe(text) + "\n")
        tables.insert(0, ("both recorded corpora (assets/data/" + " and ".join(CORPORA.values()) + ")", rows))
    return tables


def _agent_scored(exchanges, records):
    """record -> whether it is of one of the agent's scored tests (the others are learned on)."""
    from kimi_eagle.reconstruct.recorded import AGENT_SCORE_TESTS, source_test

    tests = {r["id"]: source_test(ex) for ex, r in zip(exchanges, records)}
    return lambda r: tests.get(r["id"]) in AGENT_SCORE_TESTS


def calibrate_both(corpora: dict, counts) -> tuple[list[dict], str]:
    """Both corpora calibrated together (``corpora``: dataset -> (records, scored or None)), scored out of sample
    on the agent's scored tests (learned on every other record of both)."""
    from kimi_eagle.reconstruct.recorded import CORPORA

    records = [r for rs, _ in corpora.values() for r in rs]
    tests = [scored for _, scored in corpora.values() if scored is not None]
    scored = (lambda r: any(t(r) for t in tests))
    name = "both corpora (" + " + ".join(CORPORA[d] for d in corpora) + "): the shipped table"
    return calibrate_corpus(name, records, counts, None, scored)


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.reconstruct.record import rebuild_under
    from kimi_eagle.serving.calibration import VariantCounts
    from kimi_eagle.serving.provider_table import write_table
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    if args.recorded == (args.log is not None):
        print("kimi-eagle providers: give either LOG or --recorded", file=sys.stderr)
        return 2
    tok = load_tokenizer(args.tokenizer or kimi_dir())
    counts = VariantCounts(tok, rebuild_under)
    if args.recorded:
        tables = _recorded(args, counts)
    else:
        records, left_out = _log_records(args.log)
        for reason in left_out[:20]:
            print(_safe(f"left out: {reason}"), file=sys.stderr)
        if len(left_out) > 20:
            print(f"left out: ... and {len(left_out) - 20} more line(s)", file=sys.stderr)
        rows, text = calibrate_corpus(args.log, records, counts)
        print(_safe(text))
        if left_out:
            print(f"{len(left_out)} record(s) left out (not an API record, no request, usage that is not counts, or no "
                  "known chat format)")
        tables = [(args.log, rows)]
    if args.write_table:
        source, rows = tables[0]
        print(_safe(f"provider table -> {write_table(rows, args.write_table, source)}"))
    return 0
