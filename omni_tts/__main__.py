"""`python -m omni_tts`: the `omni-tts` command (omni_tts.tools.cli)."""

import sys

from omni_tts.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
