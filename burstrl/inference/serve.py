"""python -m burstrl serve --port P (--watch DIR | --model DIR): keep a vLLM server on an inference box serving
the newest synced policy.

--watch DIR follows a sync target (burstrl.remote.sync): DIR/current names the newest complete model, and when sync
swaps it the server is stopped and a new one started on the new directory. --model DIR serves one directory
for good (the frozen reference, a judge). The server is vLLM's OpenAI-compatible one, started with the engine
arguments of params.yaml (`inference`, `model.max_len`, `seed`: burstrl.inference.engine.engine_args), so it samples
as the offline engine does. It names the model it serves `<version>-<hash12>[@<variant>]`
(burstrl.data.policy.served_name): `GET /v1/models` reports which policy version it serves, and every request of
a stage names the version it expects, so no request is answered by other weights. vLLM answers no request
before its weights are loaded; while one server stops and the next loads, stages wait (servers.wait_seconds).
A synced model that fails to load leaves the previous one serving; a server that dies is started again.
--name serves a --model directory without burstrl.json (a judge from the Hub) under that name.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from burstrl.config import load_config
from burstrl.data.policy import served_name
from burstrl.errors import ServerError
from burstrl.inference.client import EndpointDown, served_models
from burstrl.inference.engine import engine_args

SERVER = "vllm.entrypoints.openai.api_server"  # what `vllm serve` runs, in 0.11-era releases and since


def server_argv(model_dir: Path, name: str, host: str, port: int, params: Path) -> list[str]:
    cfg = load_config(params)
    argv = [sys.executable, "-m", SERVER, "--model", str(model_dir), "--served-model-name", name,
            "--host", host, "--port", str(port), "--disable-uvicorn-access-log"]
    for key, value in engine_args(cfg.inference, cfg.model.max_len, cfg.seed).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv


def resolve(args) -> Path | None:
    """The directory to serve now; None while a watched target has had no sync yet."""
    if args.model:
        return Path(args.model).resolve()
    current = Path(args.watch) / "current"
    return current.resolve() if current.exists() else None


def served(url: str) -> list[str]:
    """What the server at `url` serves now; nothing while it starts or reloads."""
    try:
        return served_models(url, timeout=5)
    except (EndpointDown, ServerError):
        return []


class Server:
    """One vLLM server process (in its own process group, so stopping it stops its engine workers too)."""

    started: set["Server"] = set()  # not yet stopped: what a SIGTERM must stop, a server still loading included

    def __init__(self, model_dir: Path, args):
        self.name = args.name or served_name(model_dir)
        self.url = f"http://{args.host}:{args.port}"
        argv = server_argv(model_dir, self.name, args.host, args.port, Path(args.params))
        print(f"serve: starting {self.name} from {model_dir} on {self.url}", flush=True)
        self.proc = subprocess.Popen(argv, start_new_session=True)
        Server.started.add(self)

    def ready(self, timeout: float) -> bool:
        """Wait until the server lists its model; False (and the server stopped) if it exits or takes too long."""
        deadline = time.monotonic() + timeout
        while self.name not in served(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                print(f"serve: the vLLM server of {self.name} did not come up "
                      f"({'exit ' + str(self.proc.returncode) if self.proc.poll() is not None else 'timed out'})",
                      flush=True)
                self.stop()
                return False
            time.sleep(0.5)
        print(f"serve: serving {self.name} on {self.url}", flush=True)
        return True

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left: engine workers may outlive the API process."""
        Server.started.discard(self)
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--watch", help="a sync target directory: serve DIR/current, reload when it moves")
    where.add_argument("--model", help="serve this model directory")
    parser.add_argument("--name", help="with --model: the name to serve it under (default: from its burstrl.json)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--params", default="params.yaml", help="engine settings (default: params.yaml)")
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="how often --watch looks for a new sync")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="longest a server may take to load")
    args = parser.parse_args()
    if args.name and args.watch:
        parser.error("--name goes with --model: a watched target's models are named by their burstrl.json")

    server: Server | None = None

    def shutdown(signum, frame):
        for running in list(Server.started):
            running.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)

    def start(target: Path) -> Server | None:
        candidate = Server(target, args)
        return candidate if candidate.ready(args.ready_timeout) else None

    serving: Path | None = None  # what the running server serves
    refused: Path | None = None  # a synced directory that failed to load: not tried again until current moves
    if resolve(args) is None:
        print(f"serve: waiting for a first sync into {args.watch}", flush=True)
    while True:
        target = resolve(args)
        if target is not None and target not in (serving, refused):
            if server is not None:
                print(f"serve: {args.watch}/current moved to {target.name}: restarting", flush=True)
                server.stop()
            server = start(target)
            if server is not None:
                serving, refused = target, None
            else:
                refused = target
                if serving is not None:
                    print(f"serve: {target.name} failed to load; back to {serving.name}", flush=True)
                    server = start(serving)
        elif server is not None and server.proc.poll() is not None:
            print(f"serve: the vLLM server of {server.name} exited ({server.proc.returncode}): restarting", flush=True)
            server = start(serving)
        if server is None and (args.model or serving is not None):
            raise SystemExit("serve: no server could be started; see the vLLM output above")
        time.sleep(args.poll_seconds)


if __name__ == "__main__":
    main()
