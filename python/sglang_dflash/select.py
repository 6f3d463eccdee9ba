"""DFlash 2 candidate selector: lattice scores and the path walk (docs/design.md §5).

For every drafted slot e (0-based over the S = B - 1 drafted positions), each
predecessor p and candidate c get the score

    s_e[p, c] = unary_e[c] + < Wp[pred_e[p]] * (Wh h_e), Ws[cand_e[c]] >

with Wp = predecessor_codebook [V, r], Ws = successor_codebook [V, r],
Wh = hidden_projection weight [r, H]. The predecessor of slot 0 is the anchor
(the verified bonus token), identical for every row p; the predecessors of
slot e >= 1 are the candidates of slot e - 1.

The walk turns the [S, K, K] lattice into one path of S tokens so that
verification stays a linear chain. Slot 0 reads row 0; every later slot reads
the row of the candidate chosen at the previous slot. Greedy rows take the
argmax; sampled rows draw from q = softmax(row / T) by inverse CDF from a
caller-supplied uniform, so the walk has no RNG of its own and can be captured
in a CUDA graph. The walk returns q, the exact distribution each token was
drawn from, because lossless verification (`rejection.py`) needs it
(docs/design.md §6.5: same temperature, same candidates, same predecessor row).

Imports torch, the stdlib and sglang_dflash.candidates only.
"""

from dataclasses import dataclass

import torch

from sglang_dflash.candidates import Candidates

# SGLang clamps the walk temperature to this floor before the walk
# (docs/design.md §6.5); q must be computed with the same clamped value.
MIN_TEMPERATURE = 1e-5


@dataclass
class Path:
    """The walk's output: one token per drafted slot and its draft distribution.

    Invariant: q[b, e, choice[b, e]] > 0, and tokens == cand_ids.gather(choice).
    """

    tokens: torch.Tensor  # [bs, S] int64 chosen token per slot
    choice: torch.Tensor  # [bs, S] int64 index into K of the chosen candidate
    # [bs, S, K] float32 the distribution each token was drawn from (one-hot for greedy rows)
    q: torch.Tensor


def lattice_scores(
    cands: Candidates,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    predecessor_codebook: torch.Tensor,
    successor_codebook: torch.Tensor,
    hidden_projection: torch.Tensor,
) -> torch.Tensor:
    """Score every (predecessor, candidate) pair of every drafted slot.

    Args:
        cands: candidates with ids and unary [bs, S, K].
        hidden: [bs, S, H] draft hidden states at the drafted slots.
        anchor: [bs] int64 verified bonus token, the predecessor of slot 0.
        predecessor_codebook: [V, r] Wp.
        successor_codebook: [V, r] Ws.
        hidden_projection: [r, H] Wh (a bias-free Linear(H -> r) weight).

    Returns:
        [bs, S, K, K] float32 scores[b, e, p, c]; all rows p of slot 0 are equal.
    """
    _check_lattice_inputs(cands, hidden, anchor, predecessor_codebook, successor_codebook,
                          hidden_projection)
    pred_ids = _predecessor_ids(cands.ids, anchor)  # [bs, S, K]
    proj = torch.matmul(hidden.float(), hidden_projection.float().t())  # [bs, S, r]
    left = predecessor_codebook.float()[pred_ids] * proj.unsqueeze(2)  # [bs, S, K(p), r]
    right = successor_codebook.float()[cands.ids]  # [bs, S, K(c), r]
    pair = torch.matmul(left, right.transpose(-1, -2))  # [bs, S, K(p), K(c)]
    return pair + cands.unary.float().unsqueeze(2)


def walk(
    scores: torch.Tensor,
    cand_ids: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    all_greedy: bool = False,
) -> Path:
    """Walk the lattice slot by slot, greedy or sampled per row.

    Non-finite scores: NaN counts as -inf and +inf as the largest float. A row
    whose scores are all -inf (after that) has nothing to sample; it falls back
    to candidate 0 with a one-hot q, so the verifier still sees a consistent
    (token, q) pair.

    Args:
        scores: [bs, S, K, K] float32 lattice from `lattice_scores`.
        cand_ids: [bs, S, K] int64 candidate token ids.
        temperature: [bs] float32 sampling temperature; clamped to
            >= MIN_TEMPERATURE, ignored for greedy rows.
        greedy: [bs] bool, True for rows that take the argmax.
        uniforms: [bs, S] float32 in [0, 1), one per slot, drawn by the caller.
        all_greedy: every row is greedy, as the caller knows on the host; the
            walk then skips the softmax and CDF. (Reading `greedy.all()` here
            would be a host read of a device value per step.)

    Returns:
        Path with tokens and choice [bs, S] and q [bs, S, K].
    """
    _check_walk_inputs(scores, cand_ids, temperature, greedy, uniforms)
    bs, num_slots, k, _ = scores.shape
    batch = torch.arange(bs, device=scores.device)
    if all_greedy:
        return _walk_greedy(scores, cand_ids, batch)
    temp = temperature.float().clamp(min=MIN_TEMPERATURE).unsqueeze(-1)  # [bs, 1]
    row = torch.zeros(bs, dtype=torch.int64, device=scores.device)  # slot 0: any row
    choices, qs = [], []
    for e in range(num_slots):
        choice, q = _walk_slot(scores[batch, e, row], temp, greedy, uniforms[:, e])
        choices.append(choice)
        qs.append(q)
        row = choice  # the next slot's predecessor is this slot's pick
    choice = torch.stack(choices, dim=1) if choices else row.new_zeros(bs, 0)
    q = torch.stack(qs, dim=1) if qs else scores.new_zeros(bs, 0, k)
    tokens = torch.gather(cand_ids, -1, choice.unsqueeze(-1)).squeeze(-1)
    return Path(tokens=tokens.to(torch.int64), choice=choice, q=q)


def _walk_greedy(scores: torch.Tensor, cand_ids: torch.Tensor, batch: torch.Tensor) -> Path:
    """`walk` for all-greedy rows: argmax of the realized row, one-hot q.

    A row with no finite score picks index 0, as in `_walk_slot` (argmax of an
    all -inf row is 0; NaN is mapped to -inf first)."""
    bs, num_slots, k, _ = scores.shape
    row = torch.zeros(bs, dtype=torch.int64, device=scores.device)
    choices = []
    for e in range(num_slots):
        row = _sanitize(scores[batch, e, row].float()).argmax(dim=-1)
        choices.append(row)
    choice = torch.stack(choices, dim=1) if choices else row.new_zeros(bs, 0)
    q = one_hot(choice, k)
    tokens = torch.gather(cand_ids, -1, choice.unsqueeze(-1)).squeeze(-1)
    return Path(tokens=tokens.to(torch.int64), choice=choice, q=q)


def _predecessor_ids(cand_ids: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """pred[b, 0, :] = anchor[b]; pred[b, e, :] = cand_ids[b, e - 1, :].

    Args:
        cand_ids: [bs, S, K] int64.
        anchor: [bs] int64.

    Returns:
        [bs, S, K] int64.
    """
    bs, _, k = cand_ids.shape
    first = anchor.long().view(bs, 1, 1).expand(bs, 1, k)
    return torch.cat([first, cand_ids[:, :-1].long()], dim=1)


def _walk_slot(
    row: torch.Tensor, temp: torch.Tensor, greedy: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one candidate per batch row from its score row.

    Args:
        row: [bs, K] scores of the realized predecessor.
        temp: [bs, 1] clamped temperatures.
        greedy: [bs] bool.
        u: [bs] uniforms in [0, 1).

    Returns:
        (choice [bs] int64, q [bs, K] float32).
    """
    row = _sanitize(row.float())
    peak = row.max(dim=-1, keepdim=True).values  # [bs, 1]
    dead = peak.squeeze(-1) == float("-inf")  # [bs] no finite score at all
    # Subtract the peak before dividing by T: row / T alone overflows for a
    # large score at a tiny T. Dead rows subtract 0 and are replaced below.
    shifted = (row - torch.where(dead.unsqueeze(-1), torch.zeros_like(peak), peak)) / temp
    q_sampled = torch.softmax(shifted, dim=-1)
    choice = torch.where(greedy, row.argmax(dim=-1), _inverse_cdf(q_sampled, u))
    choice = torch.where(dead, torch.zeros_like(choice), choice)
    picked = one_hot(choice, row.shape[-1])
    q = torch.where((greedy | dead).unsqueeze(-1), picked, q_sampled)
    return choice, q


def one_hot(index: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[...] indices in [0, n) -> [..., n] one-hot. Unlike
    `torch.nn.functional.one_hot`, which reads the indices' range back to the
    host to check it, this is a comparison on the device."""
    return (index.unsqueeze(-1) == torch.arange(n, device=index.device)).to(dtype)


def _inverse_cdf(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index = number of CDF entries <= u, clamped to the last index with q > 0.

    The clamp matters only when rounding leaves the CDF's total below u: the
    plain clamp to K - 1 could then pick a candidate with q == 0, which the
    verifier would accept unconditionally. When q[K-1] > 0 it equals the plain
    clamp to K - 1.

    Args:
        q: [bs, K] distribution (rows of NaN are handled by the caller).
        u: [bs] uniforms in [0, 1).

    Returns:
        [bs] int64.
    """
    cdf = torch.cumsum(q, dim=-1)
    count = (cdf <= u.unsqueeze(-1)).sum(dim=-1)
    positions = torch.arange(q.shape[-1], device=q.device)
    last_positive = torch.where(q > 0, positions, torch.zeros_like(positions)).max(dim=-1).values
    return torch.minimum(count, last_positive)


def _sanitize(row: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf (never chosen), +inf -> float32 max (keeps softmax finite)."""
    big = torch.finfo(torch.float32).max
    return torch.nan_to_num(row, nan=float("-inf"), posinf=big, neginf=float("-inf"))


def _check_lattice_inputs(cands, hidden, anchor, wp, ws, wh) -> None:
    """Raise ValueError, naming the tensor and shape, on inconsistent inputs."""
    ids = cands.ids
    if ids.dim() != 3 or cands.unary.shape != ids.shape:
        raise ValueError(
            f"cands.ids shape {tuple(ids.shape)} and cands.unary shape "
            f"{tuple(cands.unary.shape)} must be equal and [bs, S, K]"
        )
    bs, num_slots, _ = ids.shape
    if hidden.dim() != 3 or hidden.shape[:2] != (bs, num_slots):
        raise ValueError(f"hidden must be [{bs}, {num_slots}, H], got shape {tuple(hidden.shape)}")
    if anchor.shape != (bs,):
        raise ValueError(f"anchor must be [{bs}], got shape {tuple(anchor.shape)}")
    if wp.dim() != 2 or ws.shape != wp.shape:
        raise ValueError(
            f"predecessor_codebook shape {tuple(wp.shape)} and successor_codebook shape "
            f"{tuple(ws.shape)} must be equal and [V, r]"
        )
    if wh.shape != (wp.shape[1], hidden.shape[2]):
        raise ValueError(
            f"hidden_projection must be [r={wp.shape[1]}, H={hidden.shape[2]}], "
            f"got shape {tuple(wh.shape)}"
        )


def _check_walk_inputs(scores, cand_ids, temperature, greedy, uniforms) -> None:
    """Raise ValueError, naming the tensor and shape, on inconsistent inputs."""
    if scores.dim() != 4 or scores.shape[2] != scores.shape[3]:
        raise ValueError(f"scores must be [bs, S, K, K], got shape {tuple(scores.shape)}")
    bs, num_slots, k, _ = scores.shape
    if cand_ids.shape != (bs, num_slots, k):
        raise ValueError(
            f"cand_ids must be [{bs}, {num_slots}, {k}], got shape {tuple(cand_ids.shape)}"
        )
    if temperature.shape != (bs,):
        raise ValueError(f"temperature must be [{bs}], got shape {tuple(temperature.shape)}")
    if greedy.shape != (bs,) or greedy.dtype != torch.bool:
        raise ValueError(
            f"greedy must be bool [{bs}], got {greedy.dtype} shape {tuple(greedy.shape)}"
        )
    if uniforms.shape != (bs, num_slots):
        raise ValueError(f"uniforms must be [{bs}, {num_slots}], got shape {tuple(uniforms.shape)}")
