"""Mamba2 state-space ops of SGLang's Mamba2 mixer, in plain torch, for host tensors.

SGLang 0.5.23's `MambaMixer2` (Nemotron-H's mamba layers) runs its selective
scan through Triton kernels only (`mamba_chunk_scan_combined` over a prefill,
`selective_state_update` per decode token or verify block), which need a GPU.
These twins take the same arguments, as SGLang's mixer passes them:

* `mamba_chunk_scan_cpu`: the packed prefill sequences, each from its initial
  state (or zeros), returning each one's final state for the pool;
* `selective_state_update_cpu`: one token per request (decode), or a linear
  chain of T per request (verify), keeping the state after each position in
  the intermediate buffer for the commit and the pool untouched.

Every token, in all three, runs one `ssm_step` on contiguous [N, H, P] tensors,
and a verify rounds its state to the pool's dtype after each position as two
decode steps would: a verified position's output and state are those a decode
step produces, what greedy identity with plain decoding needs.

Formulas: the Mamba2 recurrence (Dao & Gu, arXiv 2405.21060) with the
discretization SGLang's and transformers' kernels use:
dt' = softplus(dt + dt_bias); h = h * exp(A dt') + dt' x B^T; y = h C + D x,
B and C shared by the heads of a group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["mamba_chunk_scan_cpu", "selective_state_update_cpu", "ssm_step"]


def ssm_step(state, x, dt, A, B, C, D):
    """One token, float32.
    state [N, H, P, S], x, dt [N, H, P] (dt discretized), A [H, P, S],
    B, C [N, H, S] (per head), D [H, P] or None -> (state', y [N, H, P])."""
    state = state * torch.exp(A * dt.unsqueeze(-1)) + (dt * x).unsqueeze(-1) * B.unsqueeze(-2)
    y = (state * C.unsqueeze(-2)).sum(-1)
    if D is not None:
        y = y + x * D
    return state, y


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, S] -> float32 [..., H, S]: each group's row for its H / G heads."""
    return t.float().repeat_interleave(heads // t.shape[-2], dim=-2).contiguous()


def _discretized(dt: torch.Tensor, dt_bias, softplus: bool) -> torch.Tensor:
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    return F.softplus(dt) if softplus else dt


def selective_state_update_cpu(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
                               intermediate_states_buffer=None, cache_steps=None, retrieve_parent_token=None,
                               intermediate_state_indices=None, **_):
    """Decode: x, dt [N, H, P], B, C [N, G, S]. Verify: x, dt [N, T, H, P],
    B, C [N, T, G, S]. state [slots, H, P, S] is the pool, state_batch_indices
    [N] the requests' slots; A [H, P, S], D and dt_bias [H, P]. Writes out
    (x's shape). A verify (disable_state_update) puts the state after position t
    in intermediate_states_buffer[ind[n], t] and leaves the pool as it was."""
    if z is not None or retrieve_parent_token is not None or state_batch_indices is None:
        raise NotImplementedError("selective_state_update on a CPU: gated (z) forms, draft trees and "
                                  "calls without state_batch_indices are not served")
    chain = x.dim() == 4
    if not chain:  # one token: a chain of one
        x, dt, B, C = x.unsqueeze(1), dt.unsqueeze(1), B.unsqueeze(1), C.unsqueeze(1)
    n, steps, heads = x.shape[0], x.shape[1], x.shape[2]
    slots = state_batch_indices[:n].long()
    valid = slots != pad_slot_id
    s = state[slots.clamp(min=0)].float()
    A, D = A.float().contiguous(), None if D is None else D.float().contiguous()
    rows = None if intermediate_states_buffer is None else intermediate_state_indices[:n].long()
    result = out.view(n, steps, *out.shape[-2:])
    for t in range(steps):
        s, y = ssm_step(s, x[:, t].float().contiguous(), _discretized(dt[:, t].contiguous(), dt_bias, dt_softplus),
                        A, _per_head(B[:, t], heads), _per_head(C[:, t], heads), D)
        s = s.to(state.dtype).float()  # the pool's rounding between two decode steps
        result[:, t] = y.to(result.dtype)
        if rows is not None:
            intermediate_states_buffer[rows[valid], t] = s[valid].to(intermediate_states_buffer.dtype)
    if not disable_state_update:
        state[slots[valid]] = s[valid].to(state.dtype)
    return out


def mamba_chunk_scan_cpu(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, initial_states=None,
                         cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), out=None,
                         return_final_states=False, return_varlen_states=False, return_track_states=False,
                         state_dtype=None, track_end_locs=None, return_intermediate_states=False, **_):
    """Prefill of packed sequences: x [1, T, H, P], dt [1, T, H], A [H], B, C
    [1, T, G, S], D and dt_bias [H], cu_seqlens [N + 1] (one sequence when
    None), initial_states [N, H, P, S] or None (zeros). Writes out [1, T, H, P]
    and returns what SGLang's kernel returns for the flags given: the final
    states [N, H, P, S] (varlen) and None for the chunk and tracking states."""
    if z is not None or track_end_locs is not None or return_intermediate_states:
        raise NotImplementedError("mamba_chunk_scan_combined on a CPU: gated (z) forms and state tracking "
                                  "(the extra_buffer radix cache) are not served")
    _, total, heads, head_dim = x.shape
    starts = cu_seqlens.tolist() if cu_seqlens is not None else [0, total]
    size = B.shape[-1]
    A = A.float()[:, None, None].expand(heads, head_dim, size).contiguous()
    D = None if D is None else D.float()[:, None].expand(heads, head_dim).contiguous()
    dt = _discretized(dt[0], dt_bias, dt_softplus).clamp(*dt_limit)  # [T, H]
    if out is None:
        out = torch.empty_like(x)
    finals = []
    for i in range(len(starts) - 1):
        s = (initial_states[i:i + 1].float() if initial_states is not None
             else x.new_zeros((1, heads, head_dim, size), dtype=torch.float32))
        for t in range(starts[i], starts[i + 1]):
            s, y = ssm_step(s, x[0, t:t + 1].float(), dt[t:t + 1, :, None].expand(1, heads, head_dim), A,
                            _per_head(B[0, t:t + 1], heads), _per_head(C[0, t:t + 1], heads), D)
            out[0, t] = y[0].to(out.dtype)
        finals.append(s[0])
    final = torch.stack(finals).to(state_dtype or torch.float32)
    if return_track_states:  # (chunk states, varlen final states, tracked states)
        return None, final, None
    if return_varlen_states:
        return (final[-1:], final) if return_final_states else final
    return final[-1:] if return_final_states else None
