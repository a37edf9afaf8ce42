"""Providers turn "a GPU for at most N hours" into an SSH endpoint, and give it back.

A provider has four calls: `create` (a lease: the machine is being paid for from here on, so the caller must
`terminate` it whatever happens next), `endpoint` (wait until the lease has an SSH address), `terminate`
(give it back; safe to repeat) and `reap` (find and terminate leases this project started and lost).

RunPodProvider rents pods through RunPod's official Python SDK. It is chosen over SkyPilot because a burst
needs one pod, one SSH port and one delete call: the SDK is a thin client of RunPod's API with nothing
running on this side, while SkyPilot adds a controller, its own state database and cluster abstractions
that this pipeline (DVC already tracks state) would duplicate. The SDK reads RUNPOD_API_BASE_URL, which the
tests point at a stand-in server on loopback. Pods are named PREFIX + session id, which is how `reap` knows
them and how a create that failed after the pod came into being is cleaned up.

StaticProvider is a machine the user already has (and what the tests use): nothing is rented, so
terminating gives nothing back; the on-host limit still stops the training there.
"""

import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from burstrl.config import RentConfig
from burstrl.errors import ProviderError
from burstrl.remote.sync import Target, ssh_command

PREFIX = "burstrl-"


@dataclass
class Lease:
    id: str
    name: str


@dataclass
class Endpoint:
    host: str
    """[user@]host for SSH."""
    dir: str
    """Absolute directory of the workspace there."""
    ssh: str
    """The SSH command that reaches it (a key path and options; never a key itself)."""
    usd_per_hour: float
    """What the provider charges per hour; 0 when it does not say (the session then uses cost.train_usd_per_hour)."""


def _outside(path: Path, repo: Path) -> Path:
    if path.resolve().is_relative_to(repo.resolve()):
        raise ProviderError(f"{path}: secrets must live outside the repository")
    return path


class StaticProvider:
    name = "static"

    def __init__(self, cfg: RentConfig, ssh_configured: str):
        target = Target.parse(cfg.static.host)
        if not target.host or not target.base.startswith("/"):
            raise ProviderError(f"rent.static.host '{cfg.static.host}': expected [user@]host:/absolute/dir")
        self.endpoint_ = Endpoint(target.host, target.base.rstrip("/"), ssh_command(ssh_configured), 0.0)
        self.on_expiry = cfg.static.on_expiry

    def create(self, session: str) -> Lease:
        return Lease(id=self.endpoint_.host, name=PREFIX + session)

    def endpoint(self, lease: Lease, timeout: float) -> Endpoint:
        return self.endpoint_

    def self_terminate(self, lease: Lease) -> str:
        return self.on_expiry

    def terminate(self, lease: Lease) -> None:
        print(f"rent: {lease.id} is your own machine: nothing to give back")

    def terminate_session(self, session: str) -> bool:
        return True

    def reap(self) -> list[str]:
        return []


class RunPodProvider:
    name = "runpod"

    def __init__(self, cfg: RentConfig, repo: Path = Path(".")):
        import runpod  # only the machine that rents needs the SDK

        self.sdk = runpod
        self.cfg = cfg.runpod
        key, source = os.environ.get("RUNPOD_API_KEY"), "RUNPOD_API_KEY"
        if not key:
            path = _outside(Path(self.cfg.api_key_file).expanduser(), repo)
            if not path.is_file():
                raise ProviderError(f"no RunPod API key: set RUNPOD_API_KEY or write it to {path}")
            key, source = path.read_text().strip(), str(path)
        runpod.api_key = key
        # Checked before anything is rented: a refused key later would leave nothing able to give a pod back.
        try:
            self._call("list pods", runpod.get_pods)
        except ProviderError as err:
            if isinstance(err.__cause__, runpod.error.AuthenticationError):
                raise ProviderError(f"RunPod refused the API key in {source}: {err.__cause__}") from err
            raise
        self.private_key = _outside(Path(cfg.ssh_key).expanduser(), repo)
        self.public_key = Path(f"{self.private_key}.pub")
        if not self.public_key.is_file():
            raise ProviderError(f"{self.public_key}: no public key for rent.ssh_key (ssh-keygen -t ed25519)")
        self.terminated: set[str] = set()

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # the SDK raises requests', its own and KeyError for odd answers
            raise ProviderError(f"RunPod {what} failed: {type(err).__name__}: {err}") from err

    def create(self, session: str) -> Lease:
        name = PREFIX + session
        c = self.cfg
        try:
            pod = self._call("create pod", self.sdk.create_pod, name=name, image_name=c.image, gpu_type_id=c.gpu_type,
                             gpu_count=c.gpu_count, cloud_type=c.cloud_type, container_disk_in_gb=c.disk_gb,
                             ports="22/tcp", support_public_ip=True, start_ssh=True,
                             env={"PUBLIC_KEY": self.public_key.read_text().strip()})
        except ProviderError:
            # The create may have reached RunPod before the answer was lost: a pod by this name is ours to end.
            self.terminate_session(session)
            raise
        print(f"rent: pod {pod['id']} ({name}) created: {c.gpu_count}x {c.gpu_type}", flush=True)
        return Lease(pod["id"], name)

    def endpoint(self, lease: Lease, timeout: float) -> Endpoint:
        """The pod's public SSH address, once RunPod reports one."""
        end = time.monotonic() + timeout
        while True:
            pod = self._call("get pod", self.sdk.get_pod, lease.id) or {}
            ports = (pod.get("runtime") or {}).get("ports") or []
            for port in ports:
                if port.get("privatePort") == 22 and port.get("isIpPublic"):
                    ssh = (f"ssh -p {port['publicPort']} -i {shlex.quote(str(self.private_key))} -o BatchMode=yes "
                           f"-o StrictHostKeyChecking=accept-new "
                           f"-o UserKnownHostsFile={shlex.quote(str(self.known_hosts(lease)))} -o ConnectTimeout=10")
                    return Endpoint(f"{self.cfg.ssh_user}@{port['ip']}", self.cfg.dir, ssh,
                                    float(pod.get("costPerHr") or 0.0))
            if time.monotonic() > end:
                raise ProviderError(f"pod {lease.id} got no public SSH port within {timeout:.0f}s")
            time.sleep(2)

    @staticmethod
    def known_hosts(lease: Lease) -> Path:
        # A pod's host key is new each time: trusted on first use, for this pod only.
        path = Path("build/rent") / f"known_hosts-{lease.id}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def self_terminate(self, lease: Lease) -> str:
        return self.cfg.self_terminate.format(pod_id=lease.id)

    def terminate(self, lease: Lease) -> None:
        if lease.id in self.terminated:
            return
        self._call(f"terminate pod {lease.id}", self.sdk.terminate_pod, lease.id)
        self.terminated.add(lease.id)
        print(f"rent: pod {lease.id} terminated", flush=True)

    def terminate_session(self, session: str) -> bool:
        """Terminate the pods of `session` (by their name); True once none is left running."""
        name = PREFIX + session
        try:
            for found in self._pods(name):
                self.terminate(Lease(found["id"], name))
        except ProviderError as err:
            print(f"rent: {err}", file=sys.stderr)
            return False
        return True

    def _pods(self, name: str | None = None) -> list[dict]:
        pods = self._call("list pods", self.sdk.get_pods) or []
        return [p for p in pods if (p.get("name") == name if name else p.get("name", "").startswith(PREFIX))]

    def reap(self) -> list[str]:
        found = self._pods()
        for pod in found:
            self.terminate(Lease(pod["id"], pod["name"]))
        return [pod["id"] for pod in found]


def provider(cfg: RentConfig, ssh_configured: str):
    if cfg.provider == "static":
        return StaticProvider(cfg, ssh_configured)
    return RunPodProvider(cfg)
