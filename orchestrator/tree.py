"""``tree``: beam search over reasoning steps, drafted by the small model, judged by the large one.

SeeD (2025) runs tree-of-thought search with a small model proposing thoughts
and the large model verifying them. Here, at every depth:

1. the proposer (the draft; the target in ``tree-target``, the baseline) samples
   ``k`` candidate next steps for every open branch, all in one batched call;
2. the judge (the target's 0-9 score by default) rates every candidate of every
   branch in one batched call, through the shared :class:`JudgeQueue`;
3. a branch whose candidates are all judged poor (none accepted) gets one step
   the target writes itself (greedy), rated the same way: the only time the
   target writes in ``tree``;
4. the ``beam`` best children continue, ranked by their path's mean step score;
   a child that ends the trace (an answer, EOS) is finished and kept aside.

The search stops when no branch is open, at ``max_depth``, or when the tree
has generated ``token_budget`` tokens; the answer is the best-scored finished
branch (else the best open one). The whole tree is kept as a networkx graph
(``Trace.search["tree"]``, node-link data): a node per step with its author,
text, score, tokens, time, and whether it survived the beam or is on the
chosen path.

Worked example, k=3, beam=2: the root has 3 drafted children scored 8.1, 6.0
and 7.7; the 8.1 and 7.7 branches continue. Their 6 children score (7.9, 8.4,
5.0) and (3.0, 2.0, 4.0 -- all poor: the target writes a 4th, scored 8.8). The
beam keeps the best two paths by mean score: 8.1->8.4 (8.25) and 7.7->8.8 (8.25).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError, StepCandidate, Verdict
from orchestrator.prompts import opening_messages
from orchestrator.run import Budget, ReasoningError, TraceRun
from orchestrator.stepgen import GeneratedStep, generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace
from orchestrator.verify_queue import JudgeQueue


@dataclass
class Branch:
    nodes: list[int] = field(default_factory=list)  # graph node ids, root excluded
    steps: list[StepRecord] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    ends: str | None = None  # the last step's GeneratedStep.ends

    @property
    def score(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)


def _record(index: int, author: str, step: GeneratedStep, verdict: Verdict) -> StepRecord:
    tokens = {f"num_{author}_tokens": step.num_tokens, f"{author}_seconds": step.seconds}
    return StepRecord(index, author, step.text, draft_text=step.text if author == "draft" else None,
                      accepted=verdict.accept, score=verdict.score, judge=verdict.judge, complete=step.complete,
                      **tokens)


async def tree(question: str, *, target: Engine, judge: Judge, draft: Engine | None = None,
               rules: StepRules = StepRules(), budget: Budget = Budget(), k: int = 3, beam: int = 2,
               max_depth: int = 12, temperature: float = 0.8, seed: int = 0, token_budget: int | None = None,
               proposer: str = "draft", on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    import networkx as nx

    if k < 1 or beam < 1 or max_depth < 1:
        raise ValueError(f"tree search needs k >= 1, beam >= 1 and max_depth >= 1 (got {k}, {beam}, {max_depth})")
    if proposer not in ("draft", "target"):
        raise ValueError(f"proposer must be 'draft' or 'target', got {proposer!r}")
    if judge.needs_target_step:
        raise JudgeError(f"tree search rates each candidate on its own; judge '{judge.name}' compares two steps: "
                         "use 'score'")
    if proposer == "draft" and draft is None:
        raise ValueError("tree search with proposer 'draft' needs a draft engine")
    queue = judge if isinstance(judge, JudgeQueue) else JudgeQueue(judge)
    engines = {"target": target, **({"draft": draft} if draft is not None else {})}
    run = TraceRun(question, "tree" if proposer == "draft" else "tree-target", rules, budget, engines, on_step)
    propose, target = run.engines[proposer], run.engines["target"]
    token_budget = token_budget or budget.max_tokens * k * beam
    graph = nx.DiGraph()
    graph.add_node(0, author="question", text=str(question), depth=0)
    d = rules.delimiter
    num_tokens = 0
    stop = "max_depth"
    finished: list[Branch] = []
    open_: list[Branch] = [Branch()]

    def grow(parent: Branch, author: str, step: GeneratedStep, verdict: Verdict, depth: int) -> Branch:
        node = graph.number_of_nodes()
        graph.add_node(node, author=author, text=step.text, score=verdict.score, accepted=verdict.accept,
                       num_tokens=step.num_tokens, seconds=step.seconds, depth=depth, beam=False, chosen=False)
        graph.add_edge(parent.nodes[-1] if parent.nodes else 0, node)
        record = _record(len(parent.steps), author, step, verdict)
        return Branch(parent.nodes + [node], parent.steps + [record],
                      parent.scores + [verdict.score if verdict.score is not None else 0.0], step.ends)

    try:
        openings = {role: opening_prompt(e, question) for role, e in run.engines.items()}
        judge_opening = opening_messages(question)

        def candidate(b: Branch, text: str) -> StepCandidate:
            return StepCandidate(question, tuple(s.text for s in b.steps), text, opening_messages=judge_opening)

        for depth in range(1, max_depth + 1):
            # 1. k samples per open branch, one batched call
            owners = [b for b in open_ for _ in range(k)]
            caps = [max(1, min(budget.max_step_tokens, budget.max_tokens - b.num_tokens)) for b in owners]
            seeds = [seed * 1_000_003 + depth * 10_007 + i for i in range(len(owners))]
            proposals = await generate_steps(propose, [step_prompt(openings[proposer], b.steps, d) for b in owners],
                                             rules, caps, temperature=temperature, seed=seeds)
            num_tokens += sum(p.num_tokens for p in proposals)
            # 2. every candidate of every branch judged in one batch (the queue batches across problems too)
            verdicts = await run.judge(queue, [candidate(b, p.text) for b, p in zip(owners, proposals)])
            children: list[Branch] = []
            poor: list[Branch] = []
            for i, b in enumerate(open_):
                mine = list(zip(proposals[i * k:(i + 1) * k], verdicts[i * k:(i + 1) * k]))
                if not any(v.accept for _, v in mine) and proposer == "draft":
                    poor.append(b)
                    continue
                seen: set[str] = set()
                for step, v in mine:
                    if step.text.strip() in seen:  # a repeated sample is one child
                        continue
                    seen.add(step.text.strip())
                    children.append(grow(b, proposer, step, v, depth))
            # 3. the target writes a step for branches whose candidates were all poor
            if poor:
                caps = [max(1, min(budget.max_step_tokens, budget.max_tokens - b.num_tokens)) for b in poor]
                own = await generate_steps(target, [step_prompt(openings["target"], b.steps, d) for b in poor],
                                           rules, caps)
                num_tokens += sum(s.num_tokens for s in own)
                own_verdicts = await run.judge(queue, [candidate(b, s.text) for b, s in zip(poor, own)])
                children += [grow(b, "target", s, v, depth) for b, s, v in zip(poor, own, own_verdicts)]
            # 4. finished children aside; the beam best of the rest continue
            done = [c for c in children if c.ends in ("trace", "thinking") or c.num_tokens >= budget.max_tokens]
            finished += done
            open_ = sorted((c for c in children if c not in done), key=lambda c: c.score, reverse=True)[:beam]
            for b in open_:
                graph.nodes[b.nodes[-1]]["beam"] = True
            if not open_:
                stop = "searched"
                break
            if num_tokens >= token_budget:
                stop = "token_budget"
                break
        best = max(finished or open_, key=lambda b: b.score)
        for node in best.nodes:
            graph.nodes[node]["chosen"] = True
        for i, record in enumerate(best.steps):
            run.add(record, best.ends if i == len(best.steps) - 1 else None)
        if best in finished:
            stop = run.ended or ("max_tokens" if best.num_tokens >= budget.max_tokens else stop)
    except EngineError as e:
        raise ReasoningError(f"tree: {e}", run.finish("error", error=str(e))) from e
    search = {"tree": nx.node_link_data(graph, edges="edges"), "num_finished": len(finished),
              "num_tree_tokens": num_tokens, "queue": queue.stats.to_dict(),
              "options": {"k": k, "beam": beam, "max_depth": max_depth, "temperature": temperature,
                          "proposer": proposer, "token_budget": token_budget}}
    return run.finish(stop, search=search)


async def tree_target(question: str, *, target: Engine, judge: Judge, rules: StepRules = StepRules(),
                      budget: Budget = Budget(), k: int = 3, beam: int = 2, max_depth: int = 12,
                      temperature: float = 0.8, seed: int = 0, token_budget: int | None = None,
                      on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    """The baseline: the same beam search with the target proposing every candidate."""
    return await tree(question, target=target, judge=judge, rules=rules, budget=budget, k=k, beam=beam,
                      max_depth=max_depth, temperature=temperature, seed=seed, token_budget=token_budget,
                      proposer="target", on_step=on_step)


def load_tree(trace: Trace) -> Any:
    """The search tree of a ``tree`` trace as a networkx DiGraph (also after a JSON round trip)."""
    import networkx as nx

    if not trace.search or "tree" not in trace.search:
        raise ValueError(f"trace of strategy '{trace.strategy}' holds no search tree")
    return nx.node_link_graph(trace.search["tree"], directed=True, edges="edges")

