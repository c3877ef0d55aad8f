"""``kimi-eagle billing``: billing-only validation of a reconstruction, for API users without an engine."""
from __future__ import annotations

import argparse
from pathlib import Path

from kimi_eagle.apps.cli import add_main_input, add_option
from kimi_eagle.apps.reports.billing_report import DATA_LABELS, prompt_parity_line, write_billing
from kimi_eagle.apps.reports.outputs import add_figure_options, refuse_other_report, use_figure_options
from kimi_eagle.apps.reports.toolkit import number
from kimi_eagle.data_kinds import REAL, SIMULATED, TOY, model_kind, settle
from kimi_eagle.diff.run import read_labels, read_reconstructed
from kimi_eagle.io import check_parquet
from kimi_eagle.reconstruct.source import reconstruction_source
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_main_input(p, "reconstructed", alias="--reconstructed",
                   help="reconstructed rows (parquet from `kimi-eagle reconstruct`)")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (billing_records.parquet, summary.json, metrics.json, charts, report.html)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")
    p.add_argument("--data", choices=DATA_LABELS, default=None,
                   help="override the data kind the inputs give (simulated when there are labels from `kimi-eagle "
                        "simulate`, toy when the tokenizer is stories260K's or tiny-kimi's, else the kind of the API "
                        "records the reconstruction was made from: toy for a toy model's answers, stand-in for a "
                        "server on this machine, else real); an override never calls such data real")
    p.add_argument("--labels", default=None,
                   help="labels.parquet of a labelled benchmark (`kimi-eagle simulate`): the page then shows the "
                        "verdicts' confusion against the labels with precision/recall per cause (default: a "
                        "labels.parquet beside the reconstructed file, when there is one)")
    add_figure_options(p)


def billing_data_kind(labels_path: str | Path | None, source: dict[str, str] | None, *tokenizer_names: str | None
                      ) -> tuple[str, str]:
    """``(kind, why)`` of a reconstruction's data from its provenance: ``simulated`` with the labels of a
    benchmark, ``toy`` when its tokenizer is a toy model's, else the kind of the API records it was made from
    (``source``: :func:`kimi_eagle.reconstruct.source.reconstruction_source`; toy for a toy model's answers such as
    tiny-kimi's, a stand-in for answers from a server on this machine), else ``real``."""
    if labels_path:
        return SIMULATED, f"the labels of a simulated benchmark: {labels_path}"
    for name in tokenizer_names:
        if name and model_kind(str(name)) == TOY:
            return TOY, f"the tokenizer {name} is a toy model's"
    if source and source["data"] != REAL:
        return source["data"], f"the reconstruction's metadata: {source.get('data_from', 'its source')}"
    if source is None:
        return REAL, ("no benchmark labels and no toy tokenizer; the reconstruction records no source (made before "
                      "kimi-eagle recorded one: reconstruct it again to read the kind of its API records)")
    return REAL, f"no benchmark labels and no toy tokenizer; {source.get('data_from', 'a real source')}"


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    from kimi_eagle.assets import kimi_dir

    check_parquet(args.reconstructed, "`kimi-eagle reconstruct`")  # a folder, JSONL, gzip: refused by name
    refuse_other_report(args.out, "billing")
    rows = read_reconstructed(args.reconstructed)  # refuse a bad file before loading the tokenizer
    beside = Path(args.reconstructed).parent / "labels.parquet"
    labels_path = args.labels or (beside if beside.is_file() else None)
    labels = read_labels(labels_path) if labels_path else None
    tok = load_tokenizer(args.tokenizer or kimi_dir())
    source = reconstruction_source(args.reconstructed)  # the kind of the API records it was made from
    inferred, why = billing_data_kind(labels_path, source, tok.name, args.tokenizer)
    data, note = settle(args.data, inferred, why)
    if note:
        print(f"note: {note}")
    meta = {"reconstructed": str(args.reconstructed), "tokenizer": tok.name, "data_from": why,
            **({"labels": str(labels_path)} if labels_path else {})}
    summary = write_billing(tok, rows, args.out, data, meta, labels)
    a = summary["all"]
    gap = "n/a" if a["gap_pct"] is None else f"{number(a['gap_pct'], '+.3f')}% " + (
        f"(95% CI {number(a['gap_pct_lo'], '+.3f')} … {number(a['gap_pct_hi'], '+.3f')})" if a["gap_pct_lo"] is not None else "(n too small for a CI)")
    print(f"billing-only evidence: {summary['n_records']} records {summary['verdict_class']}; gap {gap} of "
          f"{a['billed_tokens']:,} billed tokens; {prompt_parity_line(summary.get('prompt_parity'))} -> "
          f"{Path(args.out) / 'report.html'}")
    if acc := summary.get("accuracy"):
        print(f"against the labels ({labels_path}): {acc['explained']} explained verdicts, {acc['wrong_cause']} naming "
              f"a wrong cause, {acc['ambiguous']} ambiguous; {acc['unseen_effects']} labelled effects billing cannot see")
    return 0
