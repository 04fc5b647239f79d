"""A stand-in worker for tests/orchestration/test_requirements_install.py: it imports the job's
installed package (only the job's virtualenv has it), notes which python it runs on in the work
dir, and reports the package's value as a metrics line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    import spotpipe_tinypkg

    spec = json.loads(Path(sys.argv[sys.argv.index("--spec") + 1]).read_text())
    (Path(spec["work_dir"]) / "worker-python.txt").write_text(sys.executable)
    sys.stdout.write("SPOTPIPE " + json.dumps({"type": "metrics", "step": 1, "loss": float(spotpipe_tinypkg.VALUE)})
                     + "\n")
    sys.stdout.flush()
