"""``tree``: beam search over reasoning steps, drafted by the small model, judged by the large one.

SeeD (2025) runs tree-of-thought search with a small model proposing thoughts
and the large model verifying them. Here, at every depth:

1. the proposer (the draft; the target in ``tree-target``, the baseline) samples
   ``k`` candidate next steps for every open branch, all in one batched call;
2. the judge rates every candidate of every branch in one batched call, through
   the shared :class:`JudgeQueue`. By default it is the ``likelihood`` verifier:
   the target prefills each candidate and its per-token rules (floor, ranks,
   contrast) find the first implausible token, the cut;
3. with the likelihood verifier, a branch's children are its accepted
   candidates (no implausible token); a branch with none is *repaired*: the
   target keeps its candidate with the latest cut up to the cut and writes on
   from there (greedy) -- the only time the target writes in ``tree``. Other
   cut candidates are dropped, also those that end the trace (repairing them
   too, as the vote's ballots, solves fewer). With a whole-step
   judge (``score``: the target's 0-9 self-score) every candidate is a child,
   and a branch whose candidates are all poor gets a step the target writes
   whole;
4. the ``beam`` best children continue; a child that ends the trace (an answer,
   EOS) is finished and kept aside. The *branch score* ranks them: with the
   likelihood verifier, the share of the branch's tokens the target finds
   plausible (per token, never a summed logprob: no length bias), ties broken by
   the branch's worst token logprob; with a whole-step judge, the path's mean
   step score.

The first ``first_target_steps`` depths (default 2: the opening and the plan, as in
``specreason``) are proposed by the target, exactly as in ``tree-target`` (same k, seeds
and beam); the draft proposes from the next depth on. A plan is where a drafted step
goes wrong in words the target finds plausible, and no per-token rule sees it.

The search stops when no branch is open, at ``max_depth``, or when the tree
has generated ``token_budget`` tokens. The trace keeps, by default (``vote=majority``),
the best-scored finished branch holding the answer most finished branches reached; a
branch that ran out of tokens without an answer has no vote. (With a token-level
verifier nearly every surviving branch is 100% plausible, so its score says little about
which answer is right: the vote is the better guide.) Worked example: finished branches
answering 18, 18 and 16, the last best-scored: the vote keeps the best-scored of the two
18s. With ``vote=best``, or no answer reached: the best-scored finished
branch, else the best open one. The whole tree is kept as a networkx graph
(``Trace.search["tree"]``, node-link data): a node per step with its author,
text, score (and with the likelihood verifier its plausible share and cut),
tokens, time, and whether it survived the beam or is on the chosen path.

Worked example, likelihood verifier, k=3, beam=2: the root's 3 drafted candidates
have no cut, no cut, and a cut at token 5 of 20 (" ate" at -8.6): two children,
both 100% plausible, ranked by their worst tokens (-2.1 before -3.4). At depth 2
the first branch's candidates all hold a cut (at tokens 4, 11 and 7): the target
keeps the 11 tokens before the second one's cut and writes on (18 tokens): that
child is 29/29 plausible. The second branch's candidates: accepted, cut at token 9,
and cut at token 30 of 34 in "... = \\boxed{12}" (at "12"): the accepted one is its
only child, the cut ones are dropped. With the ``score`` judge, k=3, beam=2: candidates
scored 8.1, 6.0 and 7.7; the 8.1 and 7.7 branches continue. Their 6 children score
(7.9, 8.4, 5.0) and (3.0, 2.0, 4.0 -- all poor: the target writes a 4th, scored 8.8).
The beam keeps the best two paths by mean score: 8.1->8.4 (8.25) and 7.7->8.8 (8.25).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from stepspec.judges.base import Judge, JudgeError, StepCandidate, Verdict, plausible_share
from stepspec.orchestrator.driver import Policy, StrategyOptions, TargetOpening
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, draft_logprobs, judged_fields, repeats
from stepspec.orchestrator.stepgen import GeneratedStep
from stepspec.orchestrator.steps import StepRules, tally
from stepspec.orchestrator.trace import Author, StepEnd, StepRecord, StopReason, Trace, Work, join_steps
from stepspec.orchestrator.verify_queue import JudgeQueue

# What ranks the branches, by whether the judge is a token-level verifier (Trace.search["branch_score"]).
BRANCH_SCORE = {True: "plausible token share, then worst token logprob", False: "mean step score"}
# The options a trace's search record repeats.
SEARCH_OPTIONS = {"k", "beam", "max_depth", "temperature", "first_target_steps", "vote"}


class TreeTargetOptions(StrategyOptions):
    """The search's options; ``tree-target`` (the baseline, the target proposing) takes these."""

    k: int = Field(3, ge=1, description="candidate steps sampled per open branch")
    beam: int = Field(2, ge=1, description="branches that go on at each depth")
    max_depth: int = Field(12, ge=1)
    temperature: float = Field(0.8, ge=0)
    seed: int = 0
    token_budget: int | None = Field(None, ge=1, description="tokens the whole tree may generate "
                                                             "(None: budget.max_tokens * k * beam)")
    vote: Literal["majority", "best"] = Field("majority", description="which finished branch the trace keeps: "
                                              "majority: the answer most of them reached (its best-scored branch); "
                                              "best: the best-scored one")


class TreeOptions(TreeTargetOptions, TargetOpening):
    """``tree``'s: the search's, and the target proposing at the first depths."""


@dataclass
class Branch:
    nodes: list[int] = field(default_factory=list)  # graph node ids, root excluded
    steps: list[StepRecord] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # per step: the verdict's score
    ends: StepEnd | None = None  # the last step's GeneratedStep.ends
    # Per step, with a token-level verifier: (the share of its tokens it finds plausible, tokens).
    tokens: list[tuple[float, int]] = field(default_factory=list)

    @property
    def score(self) -> float:
        """The branch score: with a token-level verifier the share of the branch's tokens
        the target finds plausible; with a whole-step judge the mean step score."""
        if self.tokens:
            return plausible_share(self.tokens)
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def rank(self) -> tuple[float, ...]:
        """What the beam sorts by: the score, then (token-level) the worst token's logprob."""
        return (self.score, min(self.scores, default=0.0)) if self.tokens else (self.score,)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)


@dataclass(frozen=True)
class Child:
    """A step to grow a branch by: who wrote it, the verdict on it, and for a repaired
    step the drafted candidate it repairs."""

    author: Author
    step: GeneratedStep
    verdict: Verdict
    repaired: GeneratedStep | None = None  # the cut candidate whose kept tokens the step starts with
    judge_seconds: float = 0.0  # its share of the judge batch that rated it

    def record_fields(self) -> dict[str, Any]:
        if self.repaired is not None:
            return judged_fields(self.repaired, self.verdict, self.judge_seconds)
        drafted = self.author is Author.DRAFT  # a target-written candidate is rated, but no draft was judged
        return dict(draft_text=self.step.text if drafted else None, accepted=self.verdict.accept if drafted else None,
                    score=self.verdict.score, judge=self.verdict.judge, judge_seconds=self.judge_seconds)

    def tokens(self) -> tuple[float, int] | None:
        """(plausible share, tokens) under a token-level verdict: a repaired step's kept and
        target-written tokens are all plausible."""
        if self.verdict.plausible is None:
            return None
        if self.repaired is not None:
            return 1.0, self.verdict.cut.offset + self.step.num_tokens
        return self.verdict.plausible, max(len(self.step.token_ids), 1)


class SearchTree:
    """Everything the search wrote, as a networkx graph: node 0 the question, a node per
    step (author, text, score, tokens, time, depth, in the beam, on the chosen path)."""

    def __init__(self, question: str) -> None:
        import networkx as nx

        self.graph = nx.DiGraph()
        self.graph.add_node(0, author="question", text=str(question), depth=0)

    def grow(self, parent: Branch, child: Child, depth: int) -> Branch:
        step, verdict, tokens = child.step, child.verdict, child.tokens()
        node = self.graph.number_of_nodes()
        extra: dict[str, Any] = {}
        if tokens is not None:
            extra["plausible"] = tokens[0]
        if verdict.cut is not None:
            extra.update(cut_token=verdict.cut.token, cut_logprob=verdict.cut.target_logprob,
                         repaired=child.repaired is not None)
        self.graph.add_node(node, author=child.author.value, text=step.text, score=verdict.score,
                            accepted=verdict.accept, num_tokens=step.num_tokens, seconds=step.seconds, depth=depth,
                            beam=False, chosen=False, **extra)
        self.graph.add_edge(parent.nodes[-1] if parent.nodes else 0, node)
        record = StepRecord.written(len(parent.steps), child.author, step.text, Work(step.num_tokens, step.seconds),
                                    complete=step.complete, **child.record_fields())
        return Branch(parent.nodes + [node], parent.steps + [record],
                      parent.scores + [verdict.score if verdict.score is not None else 0.0], step.ends,
                      parent.tokens + [tokens] if tokens is not None else [])

    def mark(self, branches: list[Branch], flag: str, last_only: bool = False) -> None:
        for branch in branches:
            for node in branch.nodes[-1:] if last_only else branch.nodes:
                self.graph.nodes[node][flag] = True

    def to_dict(self) -> dict[str, Any]:
        import networkx as nx

        return nx.node_link_data(self.graph, edges="edges")


TREE = "beam search: the draft proposes k steps per branch, the target verifies them in one batch, the best go on"


@strategy("tree", TreeOptions, default_judge="likelihood", queued_judge=True, writes=TREE)
class TreeSearch(Policy):
    """The search; its one step keeps the chosen branch's steps and ends the trace."""

    proposer = Author.DRAFT  # who proposes the candidates past the opening depths

    def __init__(self, options: TreeTargetOptions, judge: Judge) -> None:
        if judge.needs_target_step:
            raise JudgeError(f"tree search rates each candidate on its own; judge '{judge.name}' compares two "
                             "steps: use 'likelihood' or 'score'")
        self.options = options
        self.queue = judge if isinstance(judge, JudgeQueue) else JudgeQueue(judge)
        self.tree, self.token_budget, self.num_tokens, self.num_finished = None, options.token_budget, 0, 0
        self.votes: dict[str, int] = {}  # per answer: the finished branches that reached it

    async def step(self, run: TraceRun) -> None:
        o, max_tokens = self.options, run.budget.max_tokens
        self.token_budget = o.token_budget or max_tokens * o.k * o.beam
        self.tree = SearchTree(run.question)
        finished, open_, stop = [], [Branch()], StopReason.MAX_DEPTH
        for depth in range(1, o.max_depth + 1):
            children = await self.expand(run, open_, depth)
            self.num_tokens = sum(e.num_generated_tokens for e in run.engines.values())  # the whole tree's
            # Beam rule: a child that ends the trace (or spends its tokens, or repeats its
            # last step) is finished and kept aside; of the rest, the beam best by branch
            # score go on. The answer is the best-scored finished branch, else the best open one.
            done = [c for c in children if c.ends in (StepEnd.TRACE, StepEnd.THINKING) or c.num_tokens >= max_tokens
                    or repeats(c.steps)]
            finished += done
            open_ = sorted((c for c in children if c not in done), key=lambda c: c.rank, reverse=True)[:o.beam]
            self.tree.mark(open_, "beam", last_only=True)
            if not open_:
                break
            if self.num_tokens >= self.token_budget:
                stop = StopReason.TOKEN_BUDGET
                break
        self.num_finished, (best, self.votes) = len(finished), choose(finished, open_, run.rules, o.vote)
        self.tree.mark([best], "chosen")
        if best in finished:  # unless its last step ended it
            stop = StopReason.REPETITION if repeats(best.steps) else StopReason.MAX_TOKENS
        run.adopt(best.steps, best.ends, stop)

    async def expand(self, run: TraceRun, open_: list[Branch], depth: int) -> list[Branch]:
        """Every open branch's children: k proposals each (one batched call), all judged in one batch
        (one queue for all problems); the target mends a branch none of whose drafted proposals pass."""
        o, tree = self.options, self.tree
        proposer = Author.TARGET if depth <= opening_depths(o) else self.proposer  # the opening and plan
        owners = [b for b in open_ for _ in range(o.k)]
        seeds = [o.seed * 1_000_003 + depth * 10_007 + i for i in range(len(owners))]
        proposals = await run.write_many(proposer, [b.steps for b in owners], temperature=o.temperature,
                                         seed=seeds, logprobs=draft_logprobs(self.queue))
        verdicts, judge_seconds = await timed_judge(run, self.queue, [candidate(run, self.queue, p, b.steps)
                                                                     for b, p in zip(owners, proposals)])
        children: list[Branch] = []
        poor: list[tuple[Branch, tuple[GeneratedStep, Verdict]]] = []
        for i, b in enumerate(open_):
            mine: dict[str, tuple[GeneratedStep, Verdict]] = {}
            for step, v in zip(proposals[i * o.k:(i + 1) * o.k], verdicts[i * o.k:(i + 1) * o.k]):
                mine.setdefault(step.text.strip(), (step, v))  # a repeated sample is one child
            for step, v in mine.values():
                grown = tree.grow(b, Child(proposer, step, v, judge_seconds=judge_seconds), depth)
                if v.accept or proposer is Author.TARGET:
                    children.append(grown)  # a rejected drafted step stays in the picture, not the search
            if proposer is Author.DRAFT and (sv := to_mend(list(mine.values()))) is not None:
                poor.append((b, sv))
        return children + (await mend(run, self.tree, self.queue, poor, depth, judge_seconds) if poor else [])

    def search(self) -> dict[str, Any]:
        return {"tree": self.tree.to_dict(), "num_finished": self.num_finished, "num_tree_tokens": self.num_tokens,
                "votes": self.votes, "queue": self.queue.stats.to_dict(),
                "branch_score": BRANCH_SCORE[self.queue.needs_draft_tokens],
                "options": {**self.options.model_dump(include=SEARCH_OPTIONS), "proposer": self.proposer.value,
                            "token_budget": self.token_budget}}


@strategy("tree-target", TreeTargetOptions, needs_draft=False, default_judge="likelihood", queued_judge=True,
          writes="the same search with the target proposing (the baseline)")
class TreeTarget(TreeSearch):
    """The baseline: the same beam search with the target proposing every candidate."""

    proposer = Author.TARGET


def to_mend(proposals: list[tuple[GeneratedStep, Verdict]]) -> tuple[GeneratedStep, Verdict] | None:
    """The drafted proposal of one branch that the target mends, if any. Mend rule: none when
    any proposal passed; else the one cut latest (it keeps the most drafted tokens), whether or
    not it ends the trace. (With a whole-step judge the target writes that branch's step whole.)

    Example: proposals accepted, cut at token 9, cut at token 30 of 34 ("\\boxed{12}" at "12"):
    none (a sibling passed); were the first one cut too, at token 4: the third, cut latest."""
    if any(v.accept for _, v in proposals):
        return None
    return max(proposals, key=lambda sv: (sv[1].cut.offset if sv[1].cut else -1, sv[1].plausible or 0.0))


def opening_depths(o: TreeTargetOptions) -> int:
    """The depths at which the target proposes in ``tree`` (the opening and the plan); the twin proposes
    at all of them with its own options."""
    return o.first_target_steps if isinstance(o, TargetOpening) else 0


def choose(finished: list[Branch], open_: list[Branch], rules: StepRules, vote: str
           ) -> tuple[Branch, dict[str, int]]:
    """The branch the trace keeps, and the votes. Vote rule (``majority``): each finished
    branch that reached an answer votes for it; the answer with the most votes wins (a tie:
    the better-scored branch's), and the best-scored branch holding it is kept. With
    ``best``, or no answer reached: the best-scored finished branch, else the best open one.

    Example: finished branches scored 1.0 (answer 60), 0.98 (20), 0.97 (20), 0.9 (none):
    20 has two votes, so the 0.98 branch is kept."""
    ranked = sorted(finished, key=lambda b: b.rank, reverse=True)
    answers, votes = tally([join_steps(b.steps, rules.delimiter) for b in ranked], rules)
    if vote == "majority" and votes:
        top = max(votes.values())
        return ranked[next(i for i, a in enumerate(answers) if votes.get(a) == top)], dict(votes)
    return max(finished or open_, key=lambda b: b.rank), dict(votes)


async def timed_judge(run: TraceRun, judge: Judge, candidates: list[StepCandidate]) -> tuple[list[Verdict], float]:
    """``judge``'s verdicts on ``candidates`` (one batch), and its seconds per candidate."""
    t0 = time.perf_counter()
    verdicts = await run.judge(judge, candidates)
    return verdicts, (time.perf_counter() - t0) / max(len(candidates), 1)


def candidate(run: TraceRun, judge: Judge, proposal: GeneratedStep, steps: list[StepRecord]) -> StepCandidate:
    """What ``judge`` sees of a proposal: its tokens for a token-level verifier, else its text."""
    return run.candidate(proposal, steps) if judge.needs_draft_tokens else run.rating(proposal.text, steps)


async def mend(run: TraceRun, tree: SearchTree, judge: Judge, poor: list[tuple[Branch, tuple[GeneratedStep, Verdict]]],
               depth: int, judge_seconds: float) -> list[Branch]:
    """The target's step for each branch whose every drafted proposal was rejected, in one
    batched call: after a token-level verifier it keeps the latest-cut proposal up to its cut
    and writes on from there; after a whole-step judge it writes the step whole (rated too)."""
    bases = [b.steps for b, _ in poor]
    if judge.needs_draft_tokens:
        written = await run.rewrite_many([v for _, (_, v) in poor], bases)
        return [tree.grow(b, Child(Author.TARGET, w, v, repaired=s, judge_seconds=judge_seconds), depth)
                for (b, (s, v)), w in zip(poor, written)]
    own = await run.write_many(Author.TARGET, bases)
    verdicts, rated = await timed_judge(run, judge, [run.rating(s.text, steps) for s, steps in zip(own, bases)])
    return [tree.grow(b, Child(Author.TARGET, s, v, judge_seconds=judge_seconds + rated), depth)
            for (b, _), s, v in zip(poor, own, verdicts)]


def load_tree(trace: Trace) -> Any:
    """The search tree of a ``tree`` trace as a networkx DiGraph (also after a JSON round trip)."""
    import networkx as nx

    if not trace.search or "tree" not in trace.search:
        raise ValueError(f"trace of strategy '{trace.strategy}' holds no search tree")
    return nx.node_link_graph(trace.search["tree"], directed=True, edges="edges")
