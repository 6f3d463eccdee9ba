"""Lossless verification of a drafted chain (docs/design.md §6).

Terminology:
    p: target distribution, the one plain SGLang decoding samples from
       (temperature, top-k, top-p, min-p applied: `target_probs`).
    q: draft distribution each draft token was actually sampled from.
    accept_len: number of accepted draft tokens, excluding the bonus.
    bonus: the target token emitted right after the accepted prefix: the
       residual draw at the first rejection, or a draw from p after the last
       draft when every draft is accepted.
    commit_len: accept_len + 1, the tokens a step appends.

Rule (Leviathan et al.): for i = 0, 1, ... accept draft x_i with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a token drawn from
norm(max(0, p_i - q_i)) over the FULL vocabulary and stop; if all S drafts are
accepted emit a token drawn from p_S. The output is then distributed exactly
as target sampling, for any q, as long as q is the distribution the draft was
really drawn from (docs/design.md §6.5).

Imports torch and the stdlib only.
"""

from dataclasses import dataclass
from typing import Optional

import torch

# Filler for `AcceptResult.tokens` past the bonus.
PAD_TOKEN_ID = -1

# SGLang's `SamplingParams` turns temperature < 1e-6 into greedy decoding
# (temperature 1.0, top_k 1); `target_probs` does the same for such rows.
GREEDY_TEMPERATURE_EPS = 1e-6


@dataclass
class AcceptResult:
    """Outcome of verifying one drafted chain per request."""

    accept_len: torch.Tensor  # [bs] int64 accepted draft tokens (excluding the bonus)
    tokens: torch.Tensor  # [bs, S+1] int64 accepted drafts, bonus at accept_len, then PAD_TOKEN_ID

    @property
    def commit_len(self) -> torch.Tensor:
        """[bs] int64 tokens appended by this step: accept_len + 1."""
        return self.accept_len + 1

    @property
    def bonus(self) -> torch.Tensor:
        """[bs] int64 the target token emitted after the accepted prefix."""
        return torch.gather(self.tokens, 1, self.accept_len.unsqueeze(1)).squeeze(1)


def target_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    *,
    ranks: Optional[int] = None,
    probe: Optional[int] = None,
) -> torch.Tensor:
    """The distribution plain SGLang decoding samples from, as dense probs.

    Mirrors SGLang 0.5.23's torch sampler (`Sampler.forward` then
    `top_k_top_p_min_p_sampling_from_probs_torch`): softmax(logits / T), sort
    descending, zero ranks >= top_k, zero ranks whose preceding cumulative
    mass already exceeds top_p (strict `>`), zero probs below
    min_p * max prob (strict `<`), renormalize. Equal probabilities are ranked
    by token id (stable sort), so top_k = 1 keeps the first maximum like
    `argmax`; SGLang's unstable sort leaves that order unspecified.

    Conventions (SGLang normalizes user values the same way):
        top_k: 1 <= k < V filters; k >= V (SGLang's TOP_K_ALL = 1 << 30) and
            k <= 0 (the user-facing -1) disable it; k == 1 is greedy.
        temperature < GREEDY_TEMPERATURE_EPS: greedy, as if T = 1, top_k = 1.
        top_p = 1.0 and min_p = 0.0 disable those filters.

    Sorting the whole vocabulary per row is most of this function's cost
    (on a CPU, 1.3 s for 128 rows of a 152k vocabulary; a top-256 is 60x
    less), and a row without filters needs no ranking at all (SGLang's simple
    case: softmax, then a draw). Two ways to rank less, same result:

        ranks: a bound the caller knows on the host (`SamplingRows.rank_bound`):
            every row with a filter keeps at most `ranks` tokens (greedy and
            top-k rows: k <= ranks), or 0 when no row filters. Only the `ranks`
            most probable tokens of each row are ranked; unfiltered rows keep
            the softmax as is.
        probe: without such a bound, first rank only the `probe` most probable
            tokens, and sort the whole vocabulary only for the rows whose kept
            set does not end within them. That takes host reads of device
            values: for callers on which they are free (a CPU).

    With either, equal probabilities straddling the last ranked position may
    keep a different token of the same probability than the full sort (as
    SGLang's unstable sort may); every other value is the same.

    Args:
        logits: [N, V] float32 target logits (after penalties, bias, grammar).
        temperature: [N] float32.
        top_p: [N] float32.
        top_k: [N] int64.
        min_p: [N] float32.

    Returns:
        [N, V] float32 probabilities; each row sums to 1.
    """
    _check_sampling_inputs(logits, temperature, top_p, top_k, min_p)
    vocab = logits.shape[-1]
    probs, k = _softmax_and_top_k(logits, temperature, top_k)
    if ranks == 0:  # no row filters
        return probs
    top_p, min_p = top_p.float(), min_p.float()
    if ranks is None and probe is not None and probe < vocab:
        kept, covered = _filtered(probs, k, top_p, min_p, probe)
        if not bool(covered.all()):  # host reads from here on
            rows = torch.nonzero(~covered).squeeze(1)
            kept[rows] = _filtered(probs[rows], k[rows], top_p[rows], min_p[rows], vocab)[0]
        return kept
    return _filtered(probs, k, top_p, min_p, min(ranks or vocab, vocab))[0]


def target_probs_sparse(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    ranks: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`target_probs` for rows that all keep at most `ranks` tokens (every row
    greedy or with 1 <= top_k <= ranks, as the caller knows on the host), as
    the `ranks` tokens each row ranks and their probabilities: the same values
    as the dense result's at those ids, every other id 0.

    Args: as `target_probs`.
    Returns:
        ([N, ranks] int64 token ids, ascending per row; [N, ranks] float32
        probabilities, zero where a filter drops the token).
    """
    _check_sampling_inputs(logits, temperature, top_p, top_k, min_p)
    vocab = logits.shape[-1]
    if not 1 <= ranks <= vocab:
        raise ValueError(f"ranks={ranks} must be in [1, vocab = {vocab}]")
    probs, k = _softmax_and_top_k(logits, temperature, top_k)
    top, order = _top_ranks(probs, ranks)
    kept = _kept(top, k, top_p.float(), min_p.float())
    ids, by_id = torch.sort(order, dim=-1)  # id order: the inverse CDF's, as over the vocabulary
    return ids, kept.gather(-1, by_id)


def _filtered(probs: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
              ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What top-k, top-p and min-p keep of each row, judged on its `ranks` most
    probable tokens (all of them when ranks = V), renormalized; rows without
    filters as they are.

    Args:
        probs: [N, V] softmax(logits / T); k: [N] effective top-k in [1, V];
        top_p, min_p: [N] float32.
    Returns:
        ([N, V] float32 probabilities, [N] bool: the row's kept set ends within
        the ranked tokens, so the result is exact for it).
    """
    vocab = probs.shape[-1]
    if ranks >= vocab:
        top, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    else:
        top, order = _top_ranks(probs, ranks)
    out = torch.zeros_like(probs).scatter_(-1, order, _kept(top, k, top_p, min_p))
    unfiltered = (k >= vocab) & (top_p >= 1.0) & (min_p <= 0.0)
    # The first unranked token is dropped if top-k ends before it, the ranked
    # mass already exceeds top_p, or min-p drops the last ranked (sorted: all after).
    covered = (ranks >= vocab) | unfiltered | (k <= ranks) | (top.sum(dim=-1) > top_p)
    covered |= top[:, -1] < top[:, 0] * min_p
    return torch.where(unfiltered.unsqueeze(-1), probs, out), covered


def _softmax_and_top_k(logits: torch.Tensor, temperature: torch.Tensor,
                       top_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(logits / T) [N, V] and the effective top-k [N] in [1, V], with
    SGLang's conventions (greedy rows: T = 1, k = 1; k <= 0 or >= V: V)."""
    vocab = logits.shape[-1]
    greedy = temperature < GREEDY_TEMPERATURE_EPS  # [N]
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    k = torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k)
    k = torch.where(greedy, torch.ones_like(k), k)
    return torch.softmax(logits.float() / temp.unsqueeze(-1), dim=-1), k


def _kept(top: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Ranked probabilities [N, R] (descending) with the filtered ones zeroed, renormalized."""
    kept = top * _keep_mask(top, k, top_p, min_p)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_ranks(probs: torch.Tensor, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `ranks` largest of each row, descending, equal values by token id
    (as the stable sort orders them): ([N, ranks] values, [N, ranks] ids)."""
    values, ids = torch.topk(probs, ranks, dim=-1)
    ids, by_id = torch.sort(ids, dim=-1)
    values, order = torch.sort(values.gather(-1, by_id), dim=-1, descending=True, stable=True)
    return values, ids.gather(-1, order)


def chain_rejection_sample(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    uniforms: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> AcceptResult:
    """Exact chain rejection sampling of S drafts per request.

    Accept test: x_i is accepted iff u_i * q_i(x_i) < p_i(x_i), i.e. with
    probability min(1, p/q) for u ~ U[0, 1). The strict `<` never accepts a
    token the target gives zero mass (filtered out by top-k/top-p/min-p),
    even when u = 0.

    The emitted token (residual at the first rejection, or the bonus after S
    accepts) is drawn with `torch.multinomial` from `generator`, so results
    are reproducible given seeded uniforms and generator. If the residual has
    no positive mass (possible only by rounding, since a rejection implies
    p != q) it is drawn from p_i instead.

    Args:
        draft_tokens: [bs, S] int64 drafted tokens x_0..x_{S-1}.
        q: [bs, S, V] float32 dense draft distribution each draft was drawn
            from (`select.dense_q`; one-hot for deterministic drafts).
        p: [bs, S+1, V] float32 target probabilities (`target_probs`); p[:, i]
            is the target conditional after the prefix plus the first i drafts.
        uniforms: [bs, S] float32 in [0, 1) for the accept tests, independent
            of the draws that produced the drafts.
        generator: torch.Generator on p's device for the emitted-token draws.

    Returns:
        AcceptResult with accept_len [bs] and tokens [bs, S+1].
    """
    _check_chain_inputs(draft_tokens, q, p, uniforms)
    bs, num_slots = draft_tokens.shape
    drafts = draft_tokens.long().unsqueeze(-1)  # [bs, S, 1]
    p_draft = torch.gather(p[:, :num_slots], -1, drafts).squeeze(-1)  # [bs, S]
    q_draft = torch.gather(q, -1, drafts).squeeze(-1)  # [bs, S]
    accepted = uniforms.float() * q_draft < p_draft  # [bs, S]
    accept_len = _leading_true(accepted)
    emit_from = _emit_distribution(_dense_q_row(q, accept_len), p, accept_len)  # [bs, V]
    emitted = torch.multinomial(emit_from, 1, generator=generator).squeeze(-1)
    return AcceptResult(accept_len, _assemble_tokens(draft_tokens, accept_len, emitted))


def greedy_accept(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> AcceptResult:
    """Greedy verification: accept while the draft equals the target argmax.

    Args:
        draft_tokens: [bs, S] int64.
        target_argmax: [bs, S+1] int64 argmax of p at every verify position.

    Returns:
        AcceptResult; the bonus is target_argmax[:, accept_len].
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [bs, S], got shape {tuple(draft_tokens.shape)}")
    bs, num_slots = draft_tokens.shape
    if target_argmax.shape != (bs, num_slots + 1):
        raise ValueError(
            f"target_argmax must be [{bs}, {num_slots + 1}], got shape {tuple(target_argmax.shape)}"
        )
    accept_len = _leading_true(draft_tokens.long() == target_argmax[:, :num_slots].long())
    bonus = torch.gather(target_argmax.long(), 1, accept_len.unsqueeze(1)).squeeze(1)
    return AcceptResult(accept_len, _assemble_tokens(draft_tokens, accept_len, bonus))


def _keep_mask(
    sorted_probs: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Which sorted entries survive top-k, then top-p, then min-p.

    Args:
        sorted_probs: [N, V] probabilities sorted descending.
        k: [N] int64 effective top-k in [1, V].
        top_p: [N] float32.
        min_p: [N] float32.

    Returns:
        [N, V] float32 0/1 mask.
    """
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device)
    keep = ranks.unsqueeze(0) < k.unsqueeze(-1)
    # Mass strictly before each rank: a rank is dropped once that exceeds top_p.
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep &= ~(mass_before > top_p.unsqueeze(-1))
    # Rank 0 always survives top-k and top-p, so the threshold uses the peak.
    keep &= ~(sorted_probs < (sorted_probs[:, :1] * min_p.unsqueeze(-1)))
    return keep.float()


def _leading_true(flags: torch.Tensor) -> torch.Tensor:
    """[bs, S] bool -> [bs] int64 count of leading True values."""
    return torch.cumprod(flags.long(), dim=1).sum(dim=1)


def _dense_q_row(q: torch.Tensor, accept_len: torch.Tensor) -> Optional[torch.Tensor]:
    """q [bs, S, V] at each request's first rejection -> [bs, V] (zero after S
    accepts), or None when S = 0."""
    bs, num_slots, _ = q.shape
    if num_slots == 0:
        return None
    batch = torch.arange(bs, device=q.device)
    q_row = q[batch, accept_len.clamp(max=num_slots - 1)].float()
    return torch.where((accept_len < num_slots).unsqueeze(-1), q_row, torch.zeros_like(q_row))


def sparse_q_row(q_ids: torch.Tensor, q_probs: torch.Tensor, accept_len: torch.Tensor,
                 vocab: int) -> Optional[torch.Tensor]:
    """A sparse q (K candidates per slot) at each request's first rejection,
    scattered over the vocabulary: [bs, V] (zero after S accepts), or None
    when S = 0. One row per request, not the [bs, S, V] of a dense q.

    Args:
        q_ids: [bs, S, K] int64 candidate ids; q_probs: [bs, S, K] float32.
        accept_len: [bs] int64 in [0, S].
    """
    bs, num_slots, _ = q_ids.shape
    if num_slots == 0:
        return None
    batch = torch.arange(bs, device=q_ids.device)
    row = accept_len.clamp(max=num_slots - 1)
    probs = torch.where((accept_len < num_slots).unsqueeze(-1), q_probs[batch, row].float(), 0.0)
    out = torch.zeros(bs, vocab, dtype=torch.float32, device=q_ids.device)
    return out.scatter_add_(1, q_ids[batch, row].long(), probs)


def _emit_distribution(q_row: Optional[torch.Tensor], p: torch.Tensor,
                       accept_len: torch.Tensor) -> torch.Tensor:
    """Unnormalized distribution of the token emitted after the accepted prefix.

    Row b is max(0, p_i - q_i) at i = accept_len[b] < S (first rejection), or
    p_S when every draft was accepted (q_row is zero there). Falls back to p_i
    when the residual has no positive mass.

    Args:
        q_row: [bs, V] q at i (`_dense_q_row`, `sparse_q_row`), None if S = 0.
        p: [bs, S+1, V].
        accept_len: [bs] int64 in [0, S].

    Returns:
        [bs, V] float32, non-negative, positive mass in every row.
    """
    batch = torch.arange(p.shape[0], device=p.device)
    p_row = p[batch, accept_len].float()  # [bs, V]
    if q_row is None:
        return p_row
    residual = (p_row - q_row).clamp(min=0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, p_row, residual)


def _assemble_tokens(
    draft_tokens: torch.Tensor, accept_len: torch.Tensor, emitted: torch.Tensor
) -> torch.Tensor:
    """[bs, S+1]: drafts before accept_len, `emitted` at it, PAD_TOKEN_ID after.

    Args:
        draft_tokens: [bs, S] int64.
        accept_len: [bs] int64.
        emitted: [bs] int64 bonus token.

    Returns:
        [bs, S+1] int64.
    """
    bs, num_slots = draft_tokens.shape
    padded = torch.cat(
        [draft_tokens.long(), draft_tokens.new_full((bs, 1), PAD_TOKEN_ID, dtype=torch.int64)], 1
    )
    positions = torch.arange(num_slots + 1, device=draft_tokens.device).unsqueeze(0)
    before_bonus = positions < accept_len.unsqueeze(1)
    tokens = torch.where(before_bonus, padded, torch.full_like(padded, PAD_TOKEN_ID))
    return tokens.scatter_(1, accept_len.unsqueeze(1), emitted.long().unsqueeze(1))


def _check_sampling_inputs(logits, temperature, top_p, top_k, min_p) -> None:
    """Raise ValueError, naming the tensor and shape, on inconsistent inputs."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    for name, tensor in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                         ("min_p", min_p)):
        if tensor.shape != (n,):
            raise ValueError(f"{name} must be [{n}], got shape {tuple(tensor.shape)}")


def _check_chain_inputs(draft_tokens, q, p, uniforms) -> None:
    """Raise ValueError, naming the tensor and shape, on inconsistent inputs
    (dense q: [bs, S, V])."""
    bs, num_slots = _check_drafts_and_p(draft_tokens, p, uniforms)
    if q.shape != (bs, num_slots, p.shape[2]):
        raise ValueError(f"q must be [{bs}, {num_slots}, {p.shape[2]}], got shape {tuple(q.shape)}")


def check_sparse_chain_inputs(draft_tokens, q_ids, q_probs, p, accept_uniforms,
                              sample_uniforms) -> None:
    """Raise ValueError, naming the tensor and shape, on inconsistent inputs
    (sparse q: ids and probabilities [bs, S, K])."""
    bs, num_slots = _check_drafts_and_p(draft_tokens, p, accept_uniforms)
    if q_ids.dim() != 3 or q_ids.shape[:2] != (bs, num_slots) or q_probs.shape != q_ids.shape:
        raise ValueError(f"q_ids and q_probs must both be [{bs}, {num_slots}, K], got shapes "
                         f"{tuple(q_ids.shape)} and {tuple(q_probs.shape)}")
    if sample_uniforms.shape != (bs, num_slots + 1):
        raise ValueError(f"sample_uniforms must be [{bs}, {num_slots + 1}], "
                         f"got shape {tuple(sample_uniforms.shape)}")


def _check_drafts_and_p(draft_tokens, p, uniforms) -> tuple[int, int]:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [bs, S], got shape {tuple(draft_tokens.shape)}")
    bs, num_slots = draft_tokens.shape
    if p.dim() != 3 or p.shape[:2] != (bs, num_slots + 1):
        raise ValueError(f"p must be [{bs}, {num_slots + 1}, V], got shape {tuple(p.shape)}")
    if uniforms.shape != (bs, num_slots):
        raise ValueError(f"uniforms must be [{bs}, {num_slots}], got shape {tuple(uniforms.shape)}")
    return bs, num_slots
