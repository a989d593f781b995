"""`python tests/support/serve_scripted.py PORT`: the serve app on scripted engines (slow steps), in a
process of its own, for tests that kill the server mid-stream."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvicorn  # noqa: E402

from stepspec.orchestrator.reasoner import Reasoner  # noqa: E402
from scripted import DRAFT_STEPS, TARGET_STEPS, FixedJudge, script  # noqa: E402
from stepspec.workflows.serve.app import build_app  # noqa: E402
from stepspec.workflows.serve.settings import ServeSettings  # noqa: E402

if __name__ == "__main__":
    port = int(sys.argv[1])
    draft, target = script(*DRAFT_STEPS), script(*TARGET_STEPS)
    draft.delay = target.delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    reasoner = Reasoner(target, draft, strategy="specreason", judge=FixedJudge(True), first_target_steps=0)
    uvicorn.run(build_app({"stepspec": reasoner}, ServeSettings(port=port)), host="127.0.0.1", port=port,
                log_level="warning")
