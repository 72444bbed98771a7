"""Workers with a DRA claim on one shared GPU are released one at a time: the next once the
cache shows the one before bound (controller/releasing.py explains kube-scheduler's double
count this avoids). Workers on other GPUs, and shared workers without a claim, do not wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trainwave.controller import releasing
from trainwave.controller.inflight import Inflight
from trainwave.controller.releasing import Release, Releaser
from trainwave.placement.records import PodRecord

pytestmark = pytest.mark.timeout(10)

KEY = ("ns", "job")


class RecordingKube:
    def __init__(self) -> None:
        self.patched: list[str] = []
        self.claims: list[str] = []

    def patch_pod(self, _namespace: str, name: str, _patch: dict[str, Any]) -> None:
        self.patched.append(name)

    def create_gpu_claim(self, claim: dict[str, Any]) -> None:
        self.claims.append(claim["metadata"]["name"])


def release(pins: dict[str, str], *, claimed: bool = True) -> Release:
    """One gang: pod name -> the shared GPU it is pinned to."""
    records = [PodRecord("ns", name, f"uid-{name}", "", False, False, False) for name in pins]
    patches = [({"metadata": {"namespace": "ns", "name": r.name}}, {}) for r in records]
    targets = [(r, "node-a", uuid, 1024) for r, uuid in zip(records, pins.values(), strict=True)]
    claims = [{"metadata": {"name": f"{name}-gpu"}} for name in pins] if claimed else []
    in_turn = frozenset(pins) if claimed else frozenset()
    return Release(KEY, patches, "summary", targets, claims, in_turn)


def releaser(kube: RecordingKube, bound: set[str]) -> Releaser:
    return Releaser(
        kube,  # type: ignore[arg-type]
        Inflight(),
        wake=lambda _key: None,
        placed=lambda _key: None,
        settled=lambda _namespace, name: name in bound,
    )


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_gpus_second_worker_waits_until_the_first_is_bound() -> None:
    kube, bound = RecordingKube(), set[str]()

    async def go() -> None:
        placer = releaser(kube, bound)
        placer.dispatch(release({"a": "GPU-1", "b": "GPU-1", "c": "GPU-2"}))
        await until(lambda: len(kube.patched) == 2)
        await asyncio.sleep(0.3)  # many polls: nothing else goes while `a` is unbound
        assert sorted(kube.patched) == ["a", "c"]
        assert sorted(kube.claims) == ["a-gpu", "b-gpu", "c-gpu"], "claims first, all at once"
        bound.add("a")
        await until(lambda: len(kube.patched) == 3)
        assert kube.patched[-1] == "b"
        bound.update(("b", "c"))
        await placer.drain()

    asyncio.run(go())


def test_two_gangs_on_one_gpu_take_turns() -> None:
    kube, bound = RecordingKube(), set[str]()

    async def go() -> None:
        placer = releaser(kube, bound)
        placer.dispatch(release({"first": "GPU-1"}))
        placer.dispatch(release({"second": "GPU-1"}))
        await until(lambda: kube.patched)
        await asyncio.sleep(0.2)
        assert len(kube.patched) == 1
        bound.add(kube.patched[0])
        await until(lambda: len(kube.patched) == 2)
        bound.add(kube.patched[1])
        await placer.drain()
        assert sorted(kube.patched) == ["first", "second"]

    asyncio.run(go())


def test_a_worker_never_bound_holds_its_gpu_only_for_the_bind_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(releasing, "BIND_WAIT_SECONDS", 0.3)
    kube = RecordingKube()

    async def go() -> None:
        placer = releaser(kube, set())
        placer.dispatch(release({"stuck": "GPU-1", "next": "GPU-1"}))
        await until(lambda: kube.patched)
        await asyncio.sleep(0.1)
        assert len(kube.patched) == 1
        await asyncio.wait_for(placer.drain(), timeout=5)
        assert len(kube.patched) == 2

    asyncio.run(go())


def test_workers_without_a_claim_are_released_together() -> None:
    kube = RecordingKube()

    async def go() -> None:
        placer = releaser(kube, set())
        placer.dispatch(release({"a": "GPU-1", "b": "GPU-1"}, claimed=False))
        await asyncio.wait_for(placer.drain(), timeout=2)

    asyncio.run(go())
    assert sorted(kube.patched) == ["a", "b"]
    assert kube.claims == []
