"""Run one sgl.Engine configuration over prompt groups and write JSON results.

Used by the integration tests in a subprocess (the CPU runtime must be set up
before SGLang is imported, and the engine spawns processes): forked from the
harness's fork server (`forked`, SGLang imported once per test session), or
with ENGINE_START_METHOD=spawn as a fresh interpreter:

    python engine_run.py SPEC.json OUT.json

`forked_server` is the fork server's way to run an HTTP server (`harness.Server`).

SPEC: {"engine": {sgl.Engine kwargs}, "runs": [{"name", "prompts" | "input_ids", "batch_size",
"sampling_params"[, "lora_path": one per prompt][, "load_lora": {name: path}, loaded into the engine
before the run][, "weights": [weight op, ...], applied before the run, their (success, message)
recorded][, "return_hidden_states": one per prompt, the states recorded in meta_info][,
"return_routed_experts": true, each prompt's routed experts (base64) recorded in meta_info]}][, "gate":
true]}. A weight op is {"op": "disk", "path"} (the engine's update_weights_from_disk) or
{"op": "tensor", "path" | None, "selector"[, "extra": {name: shape}][, "load_format"]} (every tensor
of the checkpoint at `path`, if any, plus zero tensors `extra`, through update_weights_from_tensor
inside begin / end_weight_update with that selector) or {"op": "distributed", "path", "selector"}
(the same tensors broadcast by a trainer, a thread here, rank 0 of a gloo group the engine joins,
through update_weights_from_distributed) or {"op": "check", "selector"} (check_weights' checksums,
one {name: hash} per rank). OUT also holds the server's dflash state after the last run
(`/get_server_info`'s internal_states[0]["dflash"]). Each run submits its prompts in groups of
`batch_size` (one `generate` call per group, so the decode batch holds up to that many requests) and
records output ids and meta_info per prompt. With "gate" the engine, once started, writes "ready" to
stdout and runs only after reading "go" on stdin (harness.run_engines; a forked engine does the same
over a pipe).
"""

import json
import os
import sys
import time


def _checkpoint_tensors(path, extra):
    import glob
    import os

    import torch
    from safetensors.torch import load_file

    named = []
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))) if path else []:
        named += sorted(load_file(file).items())
    return named + [(name, torch.zeros(shape)) for name, shape in extra.items()]


def _wait_idle(engine, timeout=60.0):
    """Until the scheduler has dropped the last run's finished requests (it does
    so on its next iteration; a weight update that arrives first has its cache
    flush refused, as SGLang's message says). A successful flush means idle."""
    deadline = time.time() + timeout
    while not engine.flush_cache().success:
        if time.time() > deadline:
            raise TimeoutError("the engine did not become idle")
        time.sleep(0.05)


def _weight_op(engine, op):
    _wait_idle(engine)
    if op["op"] == "check":
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        obj = CheckWeightsReqInput(action="checksum", selector=op["selector"])
        success, message, ranks, _ = engine.loop.run_until_complete(engine.tokenizer_manager.check_weights(obj))
        return [success, message, [r["checksums"] for r in ranks or []]]
    if op["op"] == "disk":
        success, message, _ = engine.update_weights_from_disk(op["path"])
        return [success, message]
    named = _checkpoint_tensors(op["path"], op.get("extra", {}))
    if op["op"] == "distributed":
        return _distributed_update(engine, named, op["selector"])
    # Engine.update_weights_from_tensor has no selector; the request type does.
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

    load_format = op.get("load_format")
    if load_format == "flattened_bucket":  # one flat tensor and its metadata, as RL trainers send
        from sglang.srt.utils.common import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        bucket = FlattenedTensorBucket(named_tensors=named)
        payload = MultiprocessingSerializer.serialize(
            {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()})
        serialized = [payload] * engine.server_args.tp_size
    else:
        serialized = engine._serialize_tensors_per_rank(named, None)
    engine.begin_weight_update(selector=op["selector"])
    try:
        obj = UpdateWeightsFromTensorReqInput(serialized_named_tensors=serialized, load_format=load_format,
                                              flush_cache=True, selector=op["selector"])
        success, message = engine.loop.run_until_complete(
            engine.tokenizer_manager.update_weights_from_tensor(obj, None))
    finally:
        engine.end_weight_update()
    return [success, message]


def _distributed_update(engine, named, selector):
    """update_weights_from_distributed as an RL trainer drives it: the trainer
    (rank 0; here a thread of this process) and the engine's ranks (1..tp) form
    a gloo group, the trainer broadcasts each tensor while every rank receives
    them in the same order and loads them into the runners `selector` names."""
    import socket
    import threading

    import torch
    from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput
    from sglang.srt.utils.common import init_custom_process_group

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    group, failures = "dflash_test_update", []
    world = 1 + engine.server_args.tp_size

    def trainer():
        try:
            pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                           world_size=world, rank=0, group_name=group)
            for _, tensor in named:
                torch.distributed.broadcast(tensor.contiguous(), src=0, group=pg)
            torch.distributed.destroy_process_group(pg)
        except Exception as exc:  # reported with the op's result
            failures.append(repr(exc))

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    success, message = engine.init_weights_update_group("127.0.0.1", port, 1, world, group, backend="gloo")
    if not success:
        return [False, message]
    engine.begin_weight_update(selector=selector)
    try:
        obj = UpdateWeightsFromDistributedReqInput(
            names=[n for n, _ in named], dtypes=[str(t.dtype).removeprefix("torch.") for _, t in named],
            shapes=[list(t.shape) for _, t in named], group_name=group, flush_cache=True, selector=selector)
        success, message = engine.loop.run_until_complete(
            engine.tokenizer_manager.update_weights_from_distributed(obj, None))
    finally:
        engine.end_weight_update()
        thread.join(timeout=60)
        engine.destroy_weights_update_group(group)
    if failures:
        return [False, f"trainer: {failures[0]}"]
    return [success, message]


META_KEYS = ("finish_reason", "completion_tokens", "spec_accept_length", "spec_verify_ct", "num_retractions",
             "cached_tokens", "prompt_tokens")


def _run(engine, run):
    weights = [_weight_op(engine, op) for op in run.get("weights", [])]
    items = run.get("input_ids") or run["prompts"]
    key = "input_ids" if "input_ids" in run else "prompt"
    bs = int(run["batch_size"])
    for name, path in run.get("load_lora", {}).items():
        engine.load_lora_adapter(name, path)
    loras = run.get("lora_path")
    hidden = run.get("return_hidden_states")  # one per prompt
    experts = bool(run.get("return_routed_experts"))
    keys = META_KEYS + (("hidden_states",) if hidden is not None else ()) + (("routed_experts",) if experts else ())
    results = []
    t0 = time.time()
    for start in range(0, len(items), bs):
        group = items[start : start + bs]
        extra = {} if loras is None else {"lora_path": loras[start : start + bs]}
        if hidden is not None:
            extra["return_hidden_states"] = hidden[start : start + bs]
        if experts:
            extra["return_routed_experts"] = True
        outs = engine.generate(**{key: group}, sampling_params=run["sampling_params"], **extra)
        for out in outs:
            meta = {k: out["meta_info"].get(k) for k in keys}
            results.append({"output_ids": out["output_ids"], "text": out.get("text"), "meta_info": meta})
    return {"name": run["name"], "seconds": time.time() - t0, "results": results, "weights": weights}


def fork_engine_processes() -> None:
    """Start the engine's scheduler and detokenizer by fork, not spawn.

    SGLang forces "spawn", so each child imports SGLang again (about 10 s of
    one core apiece, the larger part of an engine's start-up here); a fork
    inherits this process's imports. Test speed only: what a fork can hide (a
    child that would not load our plugin or our CPU runtime by itself) is
    covered by the tests that launch spawned servers (test_server.py,
    `launch_to_failure`), which keep SGLang's spawn. ENGINE_START_METHOD=spawn restores it here
    (and has the harness start this process as a fresh interpreter, not from its fork server)."""
    if os.environ.get("ENGINE_START_METHOD", "fork") != "fork":
        return
    import multiprocessing

    import torch

    # OpenMP's worker threads do not survive a fork: a child whose parent has
    # run a parallel region hangs in its own first one. This process computes
    # nothing that needs them; each scheduler sets its own thread count.
    torch.set_num_threads(1)

    set_start_method = multiprocessing.set_start_method
    multiprocessing.set_start_method = lambda method, force=False: set_start_method("fork", force=True)


def _start_sglang_here() -> None:
    """Before this process starts an engine or a server: on a host without CUDA
    the CPU runtime (again in a fork: multiprocessing resets a child's sys.path
    to the harness's, without the stand-in's directory), and engine processes
    started by fork."""
    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()
    fork_engine_processes()


def serve(spec: dict, out_path: str, released=None) -> None:
    """Start the engine `spec` names, execute its runs, write OUT. released: a
    call that reports the engine ready and returns whether to run (the harness's
    gate); without it the runs start at once."""
    _start_sglang_here()
    import sglang as sgl

    engine = sgl.Engine(**spec["engine"])
    if released is not None and not released():
        engine.shutdown()
        return
    try:
        runs = [_run(engine, run) for run in spec["runs"]]
        states = engine.get_server_info().get("internal_states") or [{}]
    finally:
        engine.shutdown()
    json.dump({"runs": runs, "dflash": states[0].get("dflash")}, open(out_path, "w"))


def _adopt(env: dict, log_path: str) -> None:
    """In a fork of the fork server: `env` replaces the environment, and
    stdout and stderr append to `log_path`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)


def forked(spec_path: str, out_path: str, env: dict, log_path: str, conn) -> None:
    """serve() in a process forked from the harness's fork server, which has
    SGLang imported already (`engine_imports`): the job's environment replaces
    the server's, its output goes to `log_path`, and the gate is `conn`."""
    _adopt(env, log_path)

    def released():
        conn.send("ready")
        return conn.recv() == "go"

    serve(json.load(open(spec_path)), out_path, released)


def forked_server(argv: list[str], env: dict, log_path: str) -> None:
    """`python -m sglang.launch_server ARGV` in a process forked from the
    harness's fork server (SGLang imported already), its own session (the
    harness stops it by process group), `env` replacing the server's, output
    to `log_path`; its scheduler and detokenizer forked too."""
    os.setsid()
    _adopt(env, log_path)
    _start_sglang_here()
    import runpy

    sys.argv = ["sglang.launch_server", *argv]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


def main():
    spec = json.load(open(sys.argv[1]))
    released = None
    if spec.get("gate"):
        # harness.run_engines reads one line from our stdout; everything else
        # written to it (here or by the engine's processes) goes to stderr.
        handshake = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)

        def released():
            handshake.write("ready\n")
            handshake.flush()
            return sys.stdin.readline().strip() == "go"

    serve(spec, sys.argv[2], released)


if __name__ == "__main__":
    main()
