"""Tool calls in a worker process: a call's name and arguments are model output, so they never run in the stage.

The worker (`python -m burstrl.env.sandbox`, one per stage) imports the tools and environment factories by dotted
name, then answers one JSON request per line on stdin with one JSON reply on its own copy of stdout (tools that
print write to stderr). Its limits (env.sandbox): an address-space limit of memory_mb above what it holds after
the imports, so an allocation past it is a MemoryError inside the call; without `network`, an audit hook refuses
sockets and new processes. The parent kills a call that outlives timeout_seconds together with its worker, and a
worker that dies (a crash, os._exit) is started again; either way the call is an error in the episode, and
environments that lived in that worker are lost, which ends their episodes. The audit hook guards against tools
that reach out by accident; a tool written to escape it can, so run untrusted tool code in a container too.
"""

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass

from burstrl.config import SandboxConfig

REFUSED_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr", "subprocess.Popen", "os.system", "os.exec",
                  "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn")


@dataclass
class Reply:
    """What a call returned: the text for the episode, whether it is an error, and whether the episode ended."""
    text: str
    error: bool = False
    done: bool = False


class Sandbox:
    """The parent's end: start the worker lazily, send requests, and survive anything the worker does."""

    def __init__(self, tools: list[str], factory: str, cfg: SandboxConfig):
        self.spec = json.dumps({"tools": tools, "factory": factory, "memory_mb": cfg.memory_mb,
                                "network": cfg.network})
        self.timeout = cfg.timeout_seconds
        self.has_factory = bool(factory)
        self.proc: subprocess.Popen | None = None
        self.live: set[str] = set()  # episodes whose environment lives in the current worker
        self.restarts = 0
        self.schemas: dict[str, list[dict]] = {}

    def start(self):
        # A restarted worker skips the schemas, the import of transformers they need with them.
        spec = json.dumps({**json.loads(self.spec), "schemas": not self.schemas})
        self.proc = subprocess.Popen([sys.executable, "-m", "burstrl.env.sandbox", spec], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True, text=True, bufsize=1)
        self.live = set()
        try:
            ready = self._read(max(60.0, self.timeout))
        except EOFError:
            ready = None
        if ready is None or not ready.get("ok"):
            self.stop()
            detail = ready.get("error") if ready else "it exited or hung while importing"
            raise RuntimeError(f"env: the tool worker could not start: {detail}")
        self.schemas = self.schemas or ready["schemas"]

    def _read(self, timeout: float) -> dict | None:
        """The worker's next reply; None when it has not answered in time; EOFError when it is gone."""
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError
        return json.loads(line)

    def _kill(self, restart: bool = True):
        """End the worker and whatever it started; the next request starts a fresh one (counted in `restarts`)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None
            self.live.clear()  # the environments it held are gone: their episodes' next calls end them
            self.restarts += restart

    def request(self, **message) -> dict:
        """One request; a hang past the timeout or a dead worker comes back as {"ok": False, "error": ...}."""
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            reply = self._read(self.timeout)
        except EOFError:
            try:
                code = self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                code = None  # it closed its end of the protocol but still runs: killed below all the same
            self._kill()
            died = f"died (exit code {code})" if code is not None else "closed its output"
            return {"ok": False, "error": f"the tool process {died}", "lost": True}
        if reply is not None:
            return reply
        self._kill()
        return {"ok": False, "error": f"timed out after {self.timeout:g}s", "lost": True}

    def tool_schemas(self, environment: str) -> list[dict]:
        """The JSON schemas of the tools `environment` ("" without a factory) offers: for the prompt's chat
        template and the response parser."""
        if self.proc is None:
            self.start()
        if environment not in self.schemas:
            raise RuntimeError(f"env: no environment named {environment!r}; there are {sorted(self.schemas)}")
        return self.schemas[environment]

    def reset(self, episode: str, environment: str, row: dict) -> Reply:
        """A new environment for `episode` (when a factory is set); its reset text, if any, joins the prompt."""
        reply = self.request(op="reset", episode=episode, environment=environment, row=row)
        if not reply.get("ok"):
            return Reply(reply["error"], error=True)
        self.live.add(episode)
        return Reply(reply.get("result") or "")

    def call(self, episode: str, name: str, arguments) -> Reply:
        if episode in self.live or not self.has_factory:
            reply = self.request(op="call", episode=episode, name=name, arguments=arguments)
        else:
            reply = {"ok": False, "error": "the environment was lost with a killed tool process", "lost": True}
        if not reply.get("ok"):
            lost = reply.get("lost", False) and self.has_factory
            return Reply(f"error: {reply['error']}", error=True, done=lost)
        return Reply(reply["result"], done=reply.get("done", False))

    def reward(self, episode: str) -> float | None:
        """The environment's own `get_reward()`, or None when it has none (or was lost)."""
        if episode not in self.live:
            return None
        reply = self.request(op="reward", episode=episode)
        return reply.get("result") if reply.get("ok") else None

    def close(self, episode: str) -> None:
        if episode in self.live:
            self.live.discard(episode)
            self.request(op="close", episode=episode)

    def stop(self):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._kill(restart=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _refuse(event, args):
    if event.startswith(REFUSED_EVENTS):
        raise PermissionError(f"{event} refused by the tool sandbox (env.sandbox.network)")


def _flag(env, name: str) -> bool:
    value = getattr(env, name, False)
    return not callable(value) and bool(value)


def _owned_reward(env) -> float | None:
    """Without `get_reward`, a number in a `reward` attribute, as TRL's OpenReward adapter keeps its episode's."""
    value = getattr(env, "reward", None)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _virtual_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _as_text(name: str, value) -> str:
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    raise TypeError(f"tool {name} returned {type(value).__name__}, not text")


def serve(spec: dict) -> None:
    """The worker's loop; see the module docstring for the protocol. Its first line is the tools' schemas."""
    import resource

    from burstrl.env import tools as toolbox

    out = os.fdopen(os.dup(1), "w", buffering=1)
    requests = os.fdopen(os.dup(0))
    os.dup2(2, 1)  # a tool's prints go to stderr, never into the protocol
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # and a tool that reads stdin reads nothing of it
    try:
        functions = {fn.__name__: fn for fn in toolbox.resolve_all(spec["tools"])}
        factories = toolbox.factories(spec["factory"])
        schemas = toolbox.schemas(functions, factories) if spec["schemas"] else {}
    except Exception as err:  # noqa: BLE001 - any import failure is reported to the parent, which stops
        out.write(json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"}) + "\n")
        return
    if spec["memory_mb"]:
        limit = _virtual_bytes() + (spec["memory_mb"] << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if not spec["network"]:
        sys.addaudithook(_refuse)
    environments: dict[str, object] = {}
    out.write(json.dumps({"ok": True, "schemas": schemas}) + "\n")
    for line in requests:
        message = json.loads(line)
        op = message["op"]
        try:
            if op == "reset":
                env = factories[message["environment"] or None]()
                environments[message["episode"]] = env
                text = env.reset(**message["row"])
                reply = {"ok": True, "result": None if text is None else _as_text("reset", text)}
            elif op == "call":
                env = environments.get(message["episode"])
                tools = toolbox.bound(env, functions)
                name = message["name"]
                if name not in tools:
                    raise LookupError(f"unknown tool {name!r}; the tools are {sorted(tools)}")
                arguments = message["arguments"]
                if not isinstance(arguments, dict):
                    raise TypeError(f"arguments of {name} must be an object, got {type(arguments).__name__}")
                text = _as_text(name, tools[name](**arguments))
                reply = {"ok": True, "result": text, "done": _flag(env, "done") or _flag(env, "finished")}
            elif op == "reward":
                env = environments[message["episode"]]
                reward = env.get_reward() if hasattr(env, "get_reward") else _owned_reward(env)
                reply = {"ok": True, "result": None if reward is None else float(reward)}
            elif op == "close":
                environments.pop(message["episode"], None)
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}"}
        except MemoryError:
            reply = {"ok": False, "error": f"out of memory (env.sandbox.memory_mb={spec['memory_mb']})"}
        except Exception as err:  # noqa: BLE001 - a failing tool is an episode event, reported as text
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
