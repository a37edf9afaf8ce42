"""The session's sshd (conftest.ssh_server) keeps answering however many connections the suite makes: its log
goes to a file, so the few hundred bytes each connection logs can never fill a pipe and block it."""

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

CONNECTIONS = 1000  # an sshd logging into an unread pipe stopped answering at about its 268th
PARALLEL = 4  # below sshd's MaxStartups (10), past which it drops connections on purpose


def test_a_thousand_connections_are_all_answered(ssh_server):
    before = ssh_server["log"].read_text().count("Accepted publickey")
    target = f"{ssh_server['user']}@127.0.0.1"

    def connect(i: int) -> tuple[int, str]:
        done = subprocess.run([*ssh_server["rsh"].split(), target, f"echo {i}"], capture_output=True, text=True,
                              timeout=60)
        return done.returncode, done.stdout.strip()

    with ThreadPoolExecutor(PARALLEL) as pool:
        answers = list(pool.map(connect, range(CONNECTIONS)))
    assert answers == [(0, str(i)) for i in range(CONNECTIONS)]
    # Every connection was logged, far more bytes than a pipe's 64 KiB buffer holds.
    log = ssh_server["log"].read_text()
    assert log.count("Accepted publickey") - before == CONNECTIONS
    assert len(log.encode()) > 64 * 1024
