"""A strict stand-in for RunPod's GraphQL API on 127.0.0.1 that records every call, for tests of
burstrl.remote.providers.

It answers the operations the RunPod SDK sends (GPU lookup, create, get, list, terminate) from an in-memory pod
table, as RunPod does:
  - every request must carry the account's API key (`Authorization: Bearer KEY`), or a pod's own key (what
    RunPod puts in a pod's environment, written here to `pod_env` for the on-pod self-terminate); else HTTP 401;
  - a new pod has no runtime for its first `pending_polls` reads (the image is being pulled), then a runtime
    with no ports for one more, and only then a public SSH port: `ssh_port` on 127.0.0.1 (the tests' sshd),
    never with `never_ports`;
  - `inject(operation, *faults)` makes the next calls of an operation ("create", "get", "list", "terminate")
    fail ("fail": HTTP 500, after doing the work, as a lost answer does) or hang ("hang": answer after
    `hang_seconds`), one fault per call, in order.
`calls` holds (operation, pod id, User-Agent, outcome) in arrival order; outcome is "ok", "fail", "hang" or
"unauthorized".
"""

import json
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

OPERATIONS = {"gpuTypes": "gpu", "podFindAndDeployOnDemand": "create", "podTerminate": "terminate",
              "myself": "list", "pod": "get"}


class RunPodStandIn:
    def __init__(self, ssh_port: int, api_key: str, pod_env: Path, usd_per_hour: float = 3.99,
                 pending_polls: int = 1):
        self.ssh_port, self.api_key, self.pod_env = ssh_port, api_key, pod_env
        self.usd_per_hour, self.pending_polls = usd_per_hour, pending_polls
        self.never_ports = False
        self.hang_seconds = 40.0  # longer than the SDK's 30 s request timeout
        self.faults: dict[str, list[str]] = {}
        self.pods: dict[str, dict] = {}
        self.calls: list[tuple[str, str | None, str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def inject(self, operation: str, *faults: str) -> None:
        assert operation in OPERATIONS.values() and set(faults) <= {"fail", "hang"}, (operation, faults)
        with self.lock:
            self.faults.setdefault(operation, []).extend(faults)

    def terminations(self, pod_id: str) -> list[tuple]:
        """The terminate calls for `pod_id` that took effect (answered at once or late): a pod given back exactly
        once has one."""
        return [c for c in self.calls if c[0] == "terminate" and c[1] == pod_id and c[3] in ("ok", "hang")]

    def created(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "create" and c[3] != "unauthorized"]

    def running(self) -> list[str]:
        return [k for k, v in self.pods.items() if v["desiredStatus"] == "RUNNING"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def authorized(self, header: str) -> bool:
        key = header.removeprefix("Bearer ")
        return key == self.api_key or any(p.get("key") == key for p in self.pods.values())

    def answer(self, query: str, agent: str, authorization: str) -> tuple[int, dict]:
        operation = next(op for gql, op in OPERATIONS.items() if re.search(rf"\b{gql}\s*[({{]", query))
        pod_id = (re.search(r'podId:\s*"([^"]+)"', query) or [None, None])[1]
        with self.lock:
            if not self.authorized(authorization):
                self.calls.append((operation, pod_id, agent, "unauthorized"))
                return 401, {}
            fault = self.faults[operation].pop(0) if self.faults.get(operation) else "ok"
            if operation == "create":
                pod_id = f"pod{len(self.pods) + 1}"
                name = re.search(r'name:\s*"([^"]+)"', query)[1]
                self.pods[pod_id] = {"id": pod_id, "name": name, "desiredStatus": "RUNNING",
                                     "costPerHr": self.usd_per_hour, "reads": 0, "key": secrets.token_hex(8)}
                self.pod_env.write_text(f"export RUNPOD_API_KEY={self.pods[pod_id]['key']}\n")
            if operation == "terminate" and fault != "fail" and pod_id in self.pods:
                self.pods[pod_id]["desiredStatus"] = "TERMINATED"
            self.calls.append((operation, pod_id, agent, fault))
            reply = self._reply(operation, pod_id, query)
        if fault == "hang":
            time.sleep(self.hang_seconds)
        return (500, {}) if fault == "fail" else (200, reply)

    def _reply(self, operation: str, pod_id: str | None, query: str) -> dict:
        if operation == "gpu":
            gpu = re.search(r'id:\s*"([^"]+)"', query)[1]
            return {"data": {"gpuTypes": [{"id": gpu, "displayName": gpu, "memoryInGb": 141}]}}
        if operation == "create":
            return {"data": {"podFindAndDeployOnDemand": {"id": pod_id, "imageName": "x", "env": [],
                                                          "machineId": "m1", "machine": {"podHostId": f"{pod_id}-h"}}}}
        if operation == "terminate":
            return {"data": {"podTerminate": None}}
        live = {k: v for k, v in self.pods.items() if v["desiredStatus"] != "TERMINATED"}
        if operation == "list":
            return {"data": {"myself": {"pods": [self._view(p, read=False) for p in live.values()]}}}
        return {"data": {"pod": self._view(live[pod_id]) if pod_id in live else None}}

    def _view(self, pod: dict, read: bool = True) -> dict:
        """What a read of `pod` shows: no runtime while pending, then a runtime without ports, then the port."""
        seen = pod.setdefault("reads", 0)
        pod["reads"] += read
        if seen < self.pending_polls:
            runtime = None
        elif seen == self.pending_polls or self.never_ports:
            runtime = {"uptimeInSeconds": 0, "ports": []}
        else:
            runtime = {"uptimeInSeconds": seen, "ports": [{"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22,
                                                           "publicPort": self.ssh_port, "type": "tcp"}]}
        return {**{k: v for k, v in pod.items() if k not in ("reads", "key")}, "runtime": runtime}

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code, reply = standin.answer(body["query"], self.headers.get("User-Agent", ""),
                                             self.headers.get("Authorization", ""))
                data = json.dumps(reply).encode() if code == 200 else b"error"
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the client gave up on a hung call
                    pass

            def log_message(self, *args):
                pass

        return Handler
