"""A real sshd on 127.0.0.1 with throwaway keys, standing in for the rented machine: the tests' `ssh_server`
fixture and the loopback benchmarks (bench/loop.py) start it. Nothing in a session uses it.

Its log goes to a file, never to a pipe: every connection logs a few hundred bytes, and an sshd writing to a
pipe nobody reads blocks, and stops answering, once the pipe's buffer is full."""

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Loopback:
    rsh: str
    """The ssh command that reaches it (RSYNC_RSH)."""
    user: str
    port: int
    key: str
    """The client's private key."""
    log: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def start(home: Path, set_env: dict[str, str] | None = None) -> Loopback:
    """sshd with its keys, config and log under `home`; `set_env` goes to every session it starts (SetEnv)."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        raise RuntimeError("sshd is not installed: `make system` (Debian: apt-get install openssh-server)")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / name)], check=True)
    (home / "authorized_keys").write_text((home / "client_key.pub").read_text())
    os.chmod(home / "authorized_keys", 0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (home / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {home / 'host_key'}\n"
        f"AuthorizedKeysFile {home / 'authorized_keys'}\nPidFile {home / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nUsePAM no\n" + "".join(f"SetEnv {k}={v}\n" for k, v in (set_env or {}).items()))
    Path("/run/sshd").mkdir(exist_ok=True)
    log = home / "sshd.log"
    proc = subprocess.Popen([sshd, "-D", "-E", str(log), "-f", str(home / "sshd_config")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rsh = (f"ssh -p {port} -i {home / 'client_key'} -o BatchMode=yes -o StrictHostKeyChecking=no "
           f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    deadline = time.monotonic() + 20
    while subprocess.run([*rsh.split(), f"{user}@127.0.0.1", "true"], capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"sshd did not come up: {log.read_text() if log.exists() else ''}")
        time.sleep(0.2)
    return Loopback(rsh, user, port, str(home / "client_key"), log, proc)
