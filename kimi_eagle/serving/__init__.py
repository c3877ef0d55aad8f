"""What a server or provider does around the model: between the Kimi chat format (below) and reconstruction (above).

One module per concern:

=====================  ===============================================================================================
``profiles/``          what a profile is (:class:`ServingProfile`, its fields and their values), the TOML files (one
                       per server version), their loader and the loaded registry
``request``            the request side: what a server does to messages and tools before and after the template
``vllm_request``       what vLLM refuses (HTTP 400) and hands the template
``sglang_request``     what SGLang refuses and hands the template
``refusal``            a server's refusal of a request (status and reason); lone surrogates
``detokenizer``        what a server's detokenizer makes of engine IDs (the text its parsers read)
``parser_engine``      the Kimi-K2 marker lexer and state machine today's servers' parsers share
``vllm_answer``        the API message vLLM returns for a completion
``sglang_answer``      the API message SGLang returns for a completion
``legacy_answer``      the older transcriptions' answer side (``vllm-legacy``, ``sglang-legacy``)
``answer``             a raw completion -> the API message under any profile (dispatch over the three above)
``unserve``            the inverse: from a server's answer back to what the model wrote, with flags
``variants``           the declared space of provider-side transformations calibration searches
``calibration``        per-provider calibration from billed counts, and the provider table as text
``provider_table``     the provider table (``kimi_eagle/data/providers.toml``): load, look up, write
``periods``            a record's period and deployment, the table's period ranges
``auto``               ``--serving auto``: each provider's profile from the table and its own evidence
``evidence``           what ``--serving auto`` chose and why, as lines and rows for the pages
=====================  ===============================================================================================

Adding a server version touches one place: a TOML file in ``profiles/`` (see its module) and its recorded vectors in
``tests/data/servers/``; Python changes only where the server does something no field describes yet.
"""
