"""Sessions (`session_params`) under DFLASH: a turn continues from the previous
turn's output as plain decoding produced it.

A verify commits a block of tokens at once. When a stop token or stop string
ends a request inside the block, SGLang records `finished_len` and reports
`output_ids[:finished_len]`, but the tokens committed after it stay in
`req.output_ids`. A non-streaming session builds the next turn's input from
`last_req.output_ids`, cut only at `max_new_tokens` (streaming sessions cut
it at `finished_len`), so the next turn would read tokens plain decoding
never produced, and its output would differ. Before a session builds a turn,
each finished request it holds is cut at `finished_len` (the KV of the cut
tokens stays where SGLang put it: their ids still match it).
"""

from __future__ import annotations

CREATE_TARGET = "sglang.srt.session.session_controller.Session.create_req"


def trim_finished_turns(session, *args, **kwargs):
    """BEFORE `Session.create_req`: a finished request's output ends at its
    `finished_len`, as in plain decoding (DFLASH servers only)."""
    from sglang.srt.runtime_context import get_spec

    if not str(get_spec().speculative_algorithm).upper().endswith("DFLASH"):
        return None
    for node in session.req_nodes.values():
        req = node.req
        if req.finished() and req.finished_len is not None and len(req.output_ids) > req.finished_len:
            req.output_ids = req.output_ids[: req.finished_len]
    return None
