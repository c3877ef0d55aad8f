"""Interop with the established EAGLE-3 trainers: SpecForge (SGLang) and vLLM's speculators.

``export_data`` (``kimi-eagle export-data``) writes exact-ID training rows in each trainer's format,
``layouts`` reads and writes their hidden-state dumps, ``speculators`` exports a drafter for
speculators' ``Eagle3DraftModel``, ``configs`` emits their run configs. The trainers themselves are
never imported here except behind an import guard; tests prove every format with their own loaders.
"""
