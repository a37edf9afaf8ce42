"""Ship a checkpoint to an inference host with rsync and publish it atomically.

Layout at each target: `<base>/<version>-<hash12>/` holds the model (hash12: the first 12 hex digits of
its content hash; `<version>-<hash12>@<variant>/` when sync ships quantized weights of it) and
`<base>/current` is a symlink to the newest version synced. A transfer lands in
`<base>/.incoming/`, is verified file by file against the sha256 sums of the source, then renamed into
place, and only then is `current` swapped (a symlink rename, atomic on POSIX), under a lock on
`<base>/.current.lock` (flock) so that of two syncs at once the newer version ends as `current`. A reader that
resolves `current` once therefore always sees a complete model, and re-syncing an older iteration never moves
`current` back. Directories are never rewritten in place: new content gets a new name.

A target is a local directory or `[user@]host:path` (rsync's rule: a colon before the first slash).
Remote steps run through the same shell snippets over SSH; the SSH command comes from RSYNC_RSH in the
environment when set, else from params, so keys and passwords never enter params or logs.
"""

import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from burstrl.data.policy import file_hashes
from burstrl.errors import SyncError
from burstrl.pipeline import faults


@dataclass
class Target:
    host: str | None
    base: str

    @classmethod
    def parse(cls, spec: str) -> "Target":
        head, sep, tail = spec.partition(":")
        if sep and "/" not in head and head:
            return cls(host=head, base=tail)
        return cls(host=None, base=spec)

    def rsync_dest(self, path: str) -> str:
        return f"{self.host}:{path}" if self.host else path


def ssh_command(configured: str) -> str:
    return os.environ.get("RSYNC_RSH") or configured


def _shell(target: Target, script: str, ssh: str) -> str:
    argv = [*shlex.split(ssh), target.host, script] if target.host else ["sh", "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        where = target.host or "localhost"
        raise SyncError(f"on {where}: `{script}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def remote_hashes(target: Target, directory: str, ssh: str) -> dict[str, str]:
    out = _shell(target, f"cd {shlex.quote(directory)} && find . -type f -exec sha256sum {{}} +", ssh)
    hashes = {}
    for line in out.splitlines():
        digest, _, name = line.partition("  ")
        hashes[name.removeprefix("./")] = digest
    return hashes


def _swap_current(base: str, name: str, version: int) -> str:
    """A shell script that points `current` at `name` unless it already names a newer version, and prints
    where `current` points. It holds a lock on the target while it reads and swaps: two syncs at once would
    otherwise both read the old link, and the older one could swap last."""
    q = shlex.quote
    return (f"cd {q(base)} && exec 9>.current.lock && flock 9 && cur=$(readlink current || true) && "
            f'if [ -z "$cur" ] || [ "${{cur%%-*}}" -le {version} ]; then '
            f"ln -sfn {q(name)} .current.tmp && mv -T .current.tmp current; fi && readlink current")


def sync_checkpoint(src: Path, version: str, content_hash: str, spec: str, ssh_configured: str,
                    variant: str | None = None) -> dict:
    """Transfer, verify and publish `src` at one target; returns the target's receipt entry. `variant` names
    derived weights of the checkpoint (quantized), which land as `<version>-<hash12>@<variant>`."""
    target = Target.parse(spec)
    ssh = ssh_command(ssh_configured)
    base = target.base.rstrip("/")
    if not base or base.startswith("~"):
        raise SyncError(f"sync target '{spec}': give an absolute path, or one relative to the (remote) home "
                        "without '~'")
    q = shlex.quote
    name = f"{version}-{content_hash[:12]}" + (f"@{variant}" if variant else "")
    incoming, final = f"{base}/.incoming/{name}", f"{base}/{name}"
    start = time.monotonic()
    _shell(target, f"mkdir -p {q(incoming)}", ssh)
    # Inference servers may run as another user: publish world-readable whatever the local umask was.
    rsync = ["rsync", "-a", "--delete", "--chmod=D755,F644", "-e", ssh, f"{src}/", target.rsync_dest(f"{incoming}/")]
    done = subprocess.run(rsync, capture_output=True, text=True)
    if done.returncode != 0:
        raise SyncError(f"rsync to {spec} failed ({done.returncode}): {done.stderr.strip()}")
    faults.point("sync_transfer")

    expected = file_hashes(src, skip=())
    got = remote_hashes(target, incoming, ssh)
    if got != expected:
        bad = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        raise SyncError(f"{spec}: checksum mismatch after transfer for {', '.join(bad)}; nothing was published")

    # The directory name carries the content hash, so an existing one already holds these exact files.
    _shell(target, f"if [ -e {q(final)} ]; then rm -rf {q(incoming)}; else mv {q(incoming)} {q(final)}; fi", ssh)
    current = _shell(target, _swap_current(base, name, int(version)), ssh).strip()
    return {
        "target": spec,
        "path": final,
        "current": current,
        "files": len(expected),
        "bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file()),
        "verified_sha256": True,
        "seconds": round(time.monotonic() - start, 2),
    }
