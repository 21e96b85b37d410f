"""`python -m omni_tts`: the command line (omni_tts.tools.cli)."""

from omni_tts.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
