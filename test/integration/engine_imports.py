"""What every engine_run process imports before it builds an engine, imported
once by the harness's fork server (`harness.run_engines`): each engine forked
from it starts with SGLang imported, about 10 s of one core saved per engine on
a 2-core host. The same imports in the same order as `engine_run.serve`: the
CPU runtime first, then SGLang and its Engine; nothing is built here, so a
forked engine differs from a fresh interpreter only in the time it starts."""

from sglang_dflash import cpu_runtime

if not cpu_runtime.cuda_available():
    cpu_runtime.activate()

import sglang  # noqa: E402,F401
import sglang.srt.entrypoints.engine  # noqa: E402,F401

import engine_run  # noqa: E402,F401
