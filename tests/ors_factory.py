"""TRL's OpenReward adapter as it ships, pointed at the server of tests/ors_adder.py: `env.environment_factory:
ors_factory.factory`."""

import os

from trl.experimental.openreward import OpenRewardSpec

# "localhost", not 127.0.0.1: the SDK routes sessions to a `sessions.` subdomain of the host.
factory = OpenRewardSpec(os.environ["BURSTRL_TEST_ORS_URL"]).environment_factory
