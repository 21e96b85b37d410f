"""`python -m omni_tts.bench`: the benchmark's entry point (omni_tts.tools.bench)."""

from omni_tts.tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
