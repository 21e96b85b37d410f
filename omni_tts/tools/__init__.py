"""The `omni-tts` command's subcommands (`cli.py` is the entry): synthesis, serving, checkpoints and
the benchmarks whose results docs/benchmarks.md records."""
