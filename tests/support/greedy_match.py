"""Whether two greedy runs of one model wrote the same tokens, as far as the dtype lets them.

Token-level speculation is lossless: the target verifies k drafted tokens in one pass and
keeps its own greedy token wherever they differ. In float32 that is exact on this CPU: the
speculating engine writes the plain engine's greedy tokens, token for token. In bfloat16
(8 bits of mantissa) a pass over k+1 positions and a one-token decode step sum in another
order, which moves a logit by up to a tenth or so; where the model's top two tokens are
that close, the two runs can pick different ones and write different texts from there.
Seen in CI on a bf16 machine: the 0.5B with n-gram lookup wrote " the" where the plain
0.5B wrote " how" at token 37 of 48 ("2. Determine the number of ..." / "how many").

So in bfloat16 the runs must agree up to their first difference, and there the plain run's
own logprobs must show a near tie: the speculating run's token among the plain run's top
candidates, within ``BF16_TIE`` of the plain run's token. A broken verifier (one that keeps
a drafted token the target would not write) fails that at the first clear choice.
"""

from stepspec.engine.types import Completion

# A logit near 30 rounds at 30 * 2^-8 = 0.12 in bfloat16; twice that for the difference of two.
BF16_TIE = 0.25


def greedy_mismatch(got: tuple[int, ...], want: Completion, dtype: str) -> str | None:
    """None when ``got`` is what ``want`` (a plain greedy run, with logprobs) allows in
    ``dtype``; otherwise why not, in one sentence."""
    first = next((i for i, (a, b) in enumerate(zip(got, want.token_ids)) if a != b), None)
    if first is None:
        return None if len(got) == len(want.token_ids) else f"{len(got)} tokens against {len(want.token_ids)}"
    if dtype == "float32":
        return f"token {first} differs ({got[first]} against {want.token_ids[first]}) in float32"
    if want.logprobs is None:
        raise ValueError("the plain run needs logprobs (Sampling(logprobs=2) or more) to judge a difference")
    at = want.logprobs[first]
    theirs = {token_id: lp for token_id, _, lp in at.top}
    if got[first] not in theirs:
        return f"token {first}: {got[first]} is not among the plain run's top {len(at.top)} ({sorted(theirs)})"
    gap = at.logprob - theirs[got[first]]
    if gap >= BF16_TIE:
        return f"token {first}: {got[first]} is {gap:.3f} below the plain run's {want.token_ids[first]}, not a tie"
    return None
