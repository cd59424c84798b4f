"""One trainer's run in a process of its own: `python bench/_side.py SIDE ENGINE PRESET MODEL STEPS WORKERS OUT`.

grpo_vs_trl.py starts one of these per run, so no run inherits another's leftovers: a TRL run leaves some 500k
Python objects behind, which makes every later garbage collection in that process slower (measured: ours 18%
slower right after TRL in one process than alone).
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

# verl_runtime from this checkout (the environment, offline and quiet, comes from grpo_vs_trl.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _workload import PRESETS  # noqa: E402


def main(side: str, engine: str, preset: str, model: str, steps: str, workers: str, out: str) -> int:
    w, out_dir = PRESETS[preset], Path(out)
    if side == "trl":
        from _trl import run_trl

        run = run_trl(w, model, int(steps), str(out_dir))
    else:
        from _ours import run_ours

        run = run_ours(w, model, int(steps), out_dir, workers=int(workers), engine=engine)
    (out_dir / "side.json").write_text(json.dumps(asdict(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
