"""Scripted engines, judges and data the tests share: the egg problem's steps for each
model, judges that accept or reject everything, the bench's add-ten problems, a local
lm-eval task."""

import asyncio
import json
import re
from pathlib import Path

from fake_engine import ScriptedEngine
from stepspec.judges.base import StepCandidate, Verdict

ROOT = Path(__file__).resolve().parents[2]  # the repository
TASKS = ROOT / "stepspec" / "workflows" / "lm_eval_tasks"


class FixedJudge:
    """Accepts (or rejects) every step: the two ends of any judge's behaviour."""

    needs_target_step = needs_draft_tokens = False
    draft_top_k = 0

    def __init__(self, accept: bool):
        self.accept = accept
        self.name = "accept-all" if accept else "reject-all"
        self.seen: list[StepCandidate] = []

    async def judge(self, candidates):
        self.seen.extend(candidates)
        return [Verdict(self.name, self.accept, score=9.0 if self.accept else 0.0) for _ in candidates]


def run(coro):
    return asyncio.run(coro)


def script(*steps: str):
    """An engine that writes steps[n] when the prompt already holds n steps."""

    def continuation(prompt: str) -> str:
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return steps[min(n, len(steps) - 1)]

    return ScriptedEngine(continuation=continuation)


Q = "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4. She sells the rest at $2. How much?"
TARGET_STEPS = ("16 - 3 - 4 = 9 eggs are left.\n\n", "9 * 2 = 18.\n\n", "The answer is \\boxed{18}.")
DRAFT_STEPS = ("16 - 3 = 13 eggs.\n\n", "13 - 4 = 9 eggs.\n\n", "So she makes \\boxed{18}.")


def write_problems(path, n=6):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"q": f"What is {i} + 10?", "a": str(i + 10)}) + "\n")
    return path


def question_number(prompt: str) -> int:
    """n in the prompt's question "What is n + 10?" (the warm-up asks "What is 2 + 3?")."""
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
    return int(a) + int(b) - 10


def engines():
    """The target is always right; the draft is wrong on odd problems; the judge (on the
    target) scores a drafted step 9 when its boxed number is right, else 0."""

    def target(prompt):  # the rest of its solution: a step per call, all of it in one generation
        answer = "\\boxed{%d}" % (question_number(prompt) + 10)
        return answer if "Add ten." in prompt else "Add ten.\n\n" + answer

    def draft(prompt):
        n = question_number(prompt)
        return "\\boxed{%d}" % (n + 10 + n % 2) if "Add ten." in prompt else "Add ten.\n\n"

    def score(prompt):
        n = question_number(prompt)
        boxed = re.findall(r"\\boxed\{(\d+)\}", prompt)
        good = not boxed or int(boxed[-1]) == n + 10
        return [("9", 0.0)] if good else [("0", 0.0)]

    return ScriptedEngine("target", next_token=score, continuation=target), ScriptedEngine("draft", continuation=draft)


def local_task(tmp_path, data_file):
    """The shipped task definition, pointed at ``data_file``."""
    text = (TASKS / "gsm8k_stepspec.yaml").read_text()
    text = text.replace("../shared/data/gsm8k_test.jsonl", str(data_file)).replace("task: gsm8k_stepspec",
                                                                                     "task: gsm8k_stepspec_tmp")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gsm8k_stepspec_tmp.yaml").write_text(text)
    return tmp_path / "tasks"
