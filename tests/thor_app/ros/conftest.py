"""The ROS tests' fixtures: each test on a ROS domain of its own, discovery on loopback only, the
`thor ros` node in-process over a scripted runtime, and a client node beside it."""

from __future__ import annotations

import pytest

from tests.helpers.ros import (
    GOOD,
    Report,
    SlowScript,
    Spinning,
    loopback_env,
    need_rclpy,
    random_domain,
    ros_config,
    ros_context,
    scripted_build,
)


@pytest.fixture
def ros(monkeypatch):
    """An initialized rclpy context on a random domain, loopback discovery only."""
    need_rclpy()
    for k in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY", "ROS_STATIC_PEERS"):
        monkeypatch.delenv(k, raising=False)
    loopback_env()
    domain = random_domain()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    with ros_context(domain) as ctx:
        yield ctx


class Thor:
    """The node (``node``, a ThorNode), its scripted runtime (``rt``) and a client node (``client``)
    spun together."""

    def __init__(
        self,
        ctx,
        loaded,
        texts=(GOOD,),
        per_token_s=0.0,
        selftest=None,
        cli_args=None,
        config=None,
        wait_ready=True,
    ):
        import rclpy

        from thor_app.ros.node import ThorNode

        self.ctx = ctx
        self.rt = SlowScript(loaded.tokenizer, list(texts), per_token_s)
        self.node = ThorNode(
            ctx,
            config or ros_config(),
            cli_args=cli_args,
            build=scripted_build(loaded, self.rt),
            selftest=selftest or (lambda loaded, backend: Report(True)),
        )
        self.client = rclpy.create_node("thor_test_client", context=ctx)
        self.spinning = Spinning(ctx, self.node.node, self.client)
        self.started = self.node.start()
        if wait_ready:
            self.started.join(60)
            assert self.node.planning.ready, self.node.planning.reason

    def close(self):
        self.node.stopping = True
        self.spinning.close()
        self.node.destroy()
        self.client.destroy_node()


@pytest.fixture
def thor(ros, tiny_llama_long):
    made = []

    def make(**kw):
        t = Thor(ros, tiny_llama_long, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def interfaces():
    from tests.helpers.ros import need_interfaces

    need_interfaces()
    from thor_interfaces.action import Plan, RunPlan
    from thor_interfaces.srv import Plan as PlanService

    return Plan, RunPlan, PlanService
