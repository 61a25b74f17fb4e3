"""`python -m memsweep.resume <sweep dir> [overrides]`: the sweep's command for resuming (sweep/resume.py)."""
from .sweep.resume import main

if __name__ == "__main__":
    main()
