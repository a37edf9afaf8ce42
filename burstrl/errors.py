"""Every error a stage expects, and the exit statuses it ends with.

A stage turns any of these into one line, `<stage>: error: <message>`, and exit status 1
(burstrl.pipeline.stage.stage); any other exception is a bug and keeps its traceback. Each message names
what was wrong where: the file, row and field of a bad input, the params key and the value given of bad params.
"""

FAILED = 1
PARTIAL = 75  # EX_TEMPFAIL: stopped on purpose with a checkpoint; run again to continue
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, SIGTERM or SIGHUP
LINK_LOST = 255  # ssh's own status: the connection, not the command, failed


class BurstrlError(Exception):
    """An error of the input, the params or the world outside, never of the code: the message says it all."""


class ConfigError(BurstrlError, ValueError):
    """Params or settings that cannot work; the message names the params file or variable, the key, the value
    given and what is allowed."""


class ContractError(BurstrlError, ValueError):
    """Input that breaks the data contract (burstrl.data.contract); the message names file, row and field."""


class ServerError(BurstrlError, RuntimeError):
    """An endpoint serves the wrong model or refused a request; the message names the endpoint and the request."""


class SyncError(BurstrlError, RuntimeError):
    """A transfer to or from another machine failed; `code` is rsync's exit status where rsync failed."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class ToolError(BurstrlError, RuntimeError):
    """An external program the stage needs is missing or failed; the message names it and its status."""


class ProviderError(BurstrlError, RuntimeError):
    """A cloud provider call failed; the message says which and what the provider answered."""


class SessionError(BurstrlError, RuntimeError):
    """A step of a rented session failed; the message says which and how."""
