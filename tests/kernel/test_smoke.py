from tests.support import Agent, Service, World


def test_handle_roundtrip(spawn, world: World, fhmon: Service) -> None:
    agent: Agent = spawn()
    assert agent.hello["uid"] == 65534
    r = agent.call("n2h", path="file")
    assert r["errno"] == 0, r
