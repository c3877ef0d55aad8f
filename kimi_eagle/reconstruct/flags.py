"""Every flag a reconstructed row can carry (its ``flags`` column), in one list: what ``export-data --drop-flag``
accepts. ``tests/test_hostile_options.py`` scans the library for flags written (``flags.append("...")`` and the
``*_FLAGS`` constants) and fails on one missing here."""
from __future__ import annotations

ROW_FLAGS = (
    # the completion conventions and marker text (kimi_eagle.chat.completion, kimi_eagle.reconstruct.record)
    "truncated", "truncated_in_tool_call", "truncated_in_tool_id", "truncated_in_reasoning", "truncation_ambiguous",
    "no_think_end", "no_reasoning", "reasoning_dropped", "reasoning_not_closed", "tool_ids_auto", "tool_ids_normalise",
    "tool_ids_keep", "tool_id_normalised", "args_not_json", "literal_marker", "prompt_literal_marker",
    "tool_declaration_json_fallback", "lone_surrogate_replaced", "tool_name_mismatch", "api_key_redacted",
    "usage_error", "format_assumed", "answer_empty",
    # the parse of IDs as written (kimi_eagle.chat.parse)
    "invalid_utf8", "other_special", "text_after_im_end", "text_after_tool_section", "text_in_tool_section",
    "malformed_tool_call", "tool_id_unparsed", "whitespace_stripped", "dropped_by_server",
    # the serving profiles' answer sides and unserve (kimi_eagle.serving)
    "tool_id_renumbered", "tool_id_random", "tool_id_made_up", "arguments_rewritten", "detokenizer_spaces",
    "reasoning_end_unknown", "content_end_unknown", "before_tools_unknown", "tool_id_unknown",
    "arguments_whitespace_unknown", "empty_arguments_ambiguous", "provider_table_thin",
    "provider_table_prompt_unexplained", "provider_table_completion_unexplained",
    # logprobs and reasoning details (kimi_eagle.reconstruct.logprobs, .reasoning)
    "logprobs_unreadable", "logprobs_mismatch", "logprobs_conflict", "reasoning_details_mismatch",
)
ROW_FLAG_FAMILIES = ("choices_dropped:", "stray_marker:")  # flags with a value after the colon


def is_row_flag(name: str) -> bool:
    """Whether ``name`` is a flag of :data:`ROW_FLAGS` or of a family (``choices_dropped:2``)."""
    return name in ROW_FLAGS or any(name.startswith(p) and len(name) > len(p) for p in ROW_FLAG_FAMILIES)
