"""One module per `kimi-eagle` subcommand: `add_arguments(parser)` and `run(args) -> int`."""
