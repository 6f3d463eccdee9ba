"""Every streamed token's logprobs reach an OpenAI chat client.

SGLang 0.5.23's streaming chat attaches a step's token logprobs to the content
chunk that step emits; a step whose text delta is empty (the final EOS token
alone, text the detokenizer holds back as a possible stop-string prefix or an
incomplete UTF-8 character) emits no content chunk, and its logprobs were
dropped unless a reasoning or tool-call parser was active (then SGLang sends
them in a chunk of their own). Which steps have an empty delta depends on how
many tokens a step commits, so a DFLASH stream, committing several per step,
dropped different logprobs than plain decoding's (typically plain lost the EOS
entry, DFLASH kept it). After SGLang's chunks for a step, logprobs none of them
carried go out in a chunk of their own, as SGLang does with a parser, so the
logprobs of a stream concatenate to the whole response's in every server.
"""

from __future__ import annotations

GENERATE_TARGET = ("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat."
                   "_generate_stream_content")

# A chunk SGLang built with logprobs: its JSON (msgspec or pydantic, no spaces)
# holds a logprobs object rather than null.
_CARRIES = '"logprobs":{'


async def send_every_step_logprobs(original, serving, *args, **kwargs):
    """AROUND `_generate_stream_content` (an async generator; SGLang calls it
    with keyword arguments only)."""
    logprobs = kwargs.get("choice_logprobs")
    if args or logprobs is None or serving._encoding_output() is not None:
        async for chunk in original(serving, *args, **kwargs):
            yield chunk
        return
    sent = False
    async for chunk in original(serving, **kwargs):
        sent = sent or _CARRIES in chunk
        yield chunk
    if not sent:
        from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

        content = kwargs["content"]
        yield build_sse_content(chunk_id=content["meta_info"]["id"], created=kwargs["created"],
                                model=kwargs["request"].model, index=kwargs["index"], logprobs=logprobs)
