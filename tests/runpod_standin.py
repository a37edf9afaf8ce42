"""A stand-in for RunPod's GraphQL API on 127.0.0.1 that records every call, for tests of burstrl.remote.providers.

It answers the operations the RunPod SDK sends (GPU lookup, create, get, list, terminate) from an in-memory
pod table, reports every pod's SSH port as `ssh_port` on 127.0.0.1 (the tests' sshd), and can inject the
failures a real provider has: `fail_create` (the pod is created, the answer is an HTTP 500) and a
`ssh_port` nobody listens on. `calls` holds (operation, pod id, User-Agent) in arrival order.
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPERATIONS = ("gpuTypes", "podFindAndDeployOnDemand", "podTerminate", "myself", "pod")


class RunPodStandIn:
    def __init__(self, ssh_port: int, usd_per_hour: float = 3.99):
        self.ssh_port, self.usd_per_hour = ssh_port, usd_per_hour
        self.fail_create = False
        self.pods: dict[str, dict] = {}
        self.calls: list[tuple[str, str | None, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def terminations(self, pod_id: str) -> list[tuple[str, str | None, str]]:
        return [c for c in self.calls if c[0] == "podTerminate" and c[1] == pod_id]

    def created(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "podFindAndDeployOnDemand"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, query: str, agent: str) -> tuple[int, dict]:
        operation = next(op for op in OPERATIONS if re.search(rf"\b{op}\s*[({{]", query))
        pod_id = (re.search(r'podId:\s*"([^"]+)"', query) or [None, None])[1]
        with self.lock:
            if operation == "podFindAndDeployOnDemand":
                pod_id = f"pod{len(self.pods) + 1}"
                name = re.search(r'name:\s*"([^"]+)"', query)[1]
                self.pods[pod_id] = {"id": pod_id, "name": name, "desiredStatus": "RUNNING",
                                     "costPerHr": self.usd_per_hour, "query": query}
            self.calls.append((operation, pod_id, agent))
            if operation == "gpuTypes":
                gpu = re.search(r'id:\s*"([^"]+)"', query)[1]
                return 200, {"data": {"gpuTypes": [{"id": gpu, "displayName": gpu, "memoryInGb": 141}]}}
            if operation == "podFindAndDeployOnDemand":
                if self.fail_create:
                    return 500, {}
                return 200, {"data": {operation: {"id": pod_id, "imageName": "x", "env": [], "machineId": "m1",
                                                  "machine": {"podHostId": f"{pod_id}-host"}}}}
            if operation == "podTerminate":
                if pod_id in self.pods:
                    self.pods[pod_id]["desiredStatus"] = "TERMINATED"
                return 200, {"data": {"podTerminate": None}}
            live = {k: v for k, v in self.pods.items() if v["desiredStatus"] != "TERMINATED"}
            if operation == "myself":
                return 200, {"data": {"myself": {"pods": [self._view(p) for p in live.values()]}}}
            return 200, {"data": {"pod": self._view(live[pod_id]) if pod_id in live else None}}

    def _view(self, pod: dict) -> dict:
        ports = [{"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22, "publicPort": self.ssh_port,
                  "type": "tcp"}]
        return {**{k: v for k, v in pod.items() if k != "query"}, "runtime": {"ports": ports}}

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code, reply = standin.answer(body["query"], self.headers.get("User-Agent", ""))
                data = json.dumps(reply).encode() if code == 200 else b"internal error"
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler
