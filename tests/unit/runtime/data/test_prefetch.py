"""Loader defaults from the CPU quota and CUDA presence; the device prefetcher on CPU."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainwave.runtime.data.loader_defaults import (
    LoaderDefaults,
    compute_loader_defaults,
    cpu_quota,
    cuda_present,
    resolve_loader_defaults,
)
from trainwave.runtime.data.prefetch import (
    NO_CUDA,
    ConcurrentFetch,
    DevicePrefetcher,
    build_loader,
    with_defaults,
)
from trainwave.runtime.settings import load_settings


def cgroup_root(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


QUOTAS = {
    "v2-two-cpus": ({"cpu.max": "200000 100000\n"}, 2.0),
    "v2-half-cpu": ({"cpu.max": "50000 100000\n"}, 0.5),
    "v1-four-cpus": (
        {"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"},
        4.0,
    ),
}


@pytest.mark.parametrize(("files", "expected"), QUOTAS.values(), ids=QUOTAS.keys())
def test_cpu_quota_from_cgroup(tmp_path: Path, files: dict[str, str], expected: float) -> None:
    assert cpu_quota(cgroup_root(tmp_path, files)) == expected


def test_unlimited_cgroup_falls_back_to_the_machine(tmp_path: Path) -> None:
    assert cpu_quota(cgroup_root(tmp_path, {"cpu.max": "max 100000\n"})) >= 1


DEFAULTS = {
    "one-process-two-cpus": (2.0, 1, False, LoaderDefaults(2, False, True, 4, 4)),
    "eight-processes-96-cpus-cuda": (96.0, 8, True, LoaderDefaults(12, True, True, 4, 4)),
    "more-processes-than-cpus": (2.0, 8, True, LoaderDefaults(1, True, True, 4, 4)),
    "capped": (512.0, 1, True, LoaderDefaults(16, True, True, 4, 4)),
}


@pytest.mark.parametrize(
    ("cpus", "processes", "cuda", "expected"), DEFAULTS.values(), ids=DEFAULTS.keys()
)
def test_compute_loader_defaults(
    cpus: float, processes: int, cuda: bool, expected: LoaderDefaults
) -> None:
    assert compute_loader_defaults(cpus=cpus, processes=processes, cuda=cuda) == expected


def test_environment_overrides_each_value() -> None:
    settings = load_settings(
        {"TRAINWAVE_LOADER_NUM_WORKERS": "6", "TRAINWAVE_LOADER_PERSISTENT_WORKERS": "false"}
    )
    defaults = resolve_loader_defaults(settings, cpus=2.0, cuda=False)
    assert defaults == LoaderDefaults(6, False, False, 4, 4)


def test_env_round_trip_through_settings() -> None:
    defaults = LoaderDefaults(3, True, False, 2, 6)
    assert (
        resolve_loader_defaults(load_settings(defaults.as_env()), cpus=64.0, cuda=False) == defaults
    )


def test_no_workers_means_no_prefetch_arguments() -> None:
    assert LoaderDefaults(0, False, True, 4).kwargs() == {
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
    }


def dataset(count: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(count, dtype=torch.float32), torch.arange(count) % 2)


def test_with_defaults_rebuilds_an_in_process_loader_keeping_its_batching() -> None:
    plain = DataLoader(dataset(), batch_size=4, drop_last=True)
    rebuilt = with_defaults(plain, LoaderDefaults(2, False, True, 2))
    assert (
        rebuilt.num_workers,
        rebuilt.batch_size,
        rebuilt.drop_last,
        rebuilt.prefetch_factor,
    ) == (2, 4, True, 2)
    assert [b[0].tolist() for b in rebuilt] == [b[0].tolist() for b in plain]


def test_with_defaults_keeps_a_batch_sampler() -> None:
    batches = [[0, 1], [2, 3, 4]]
    plain = DataLoader(dataset(), batch_sampler=batches)
    rebuilt = with_defaults(plain, LoaderDefaults(1, False, False, 2))
    assert [b[0].tolist() for b in rebuilt] == [[0.0, 1.0], [2.0, 3.0, 4.0]]


def test_with_defaults_leaves_a_loader_with_workers_alone() -> None:
    chosen = DataLoader(dataset(), batch_size=2, num_workers=1)
    assert with_defaults(chosen, LoaderDefaults(8, False, True, 4)) is chosen


def test_build_loader_explicit_arguments_win() -> None:
    loader = build_loader(dataset(), LoaderDefaults(2, False, True, 4), batch_size=5, num_workers=0)
    assert (loader.num_workers, loader.persistent_workers, loader.batch_size) == (0, False, 5)


Pair = namedtuple("Pair", "x y")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU passthrough")
def test_prefetcher_without_cuda_passes_batches_through() -> None:
    batches = [{"x": torch.ones(2), "meta": "a"}, Pair(torch.zeros(1), [torch.ones(1)])]
    prefetcher = DevicePrefetcher(batches)
    assert prefetcher.status == NO_CUDA
    out = list(prefetcher)
    assert out[0]["meta"] == "a"
    assert torch.equal(out[0]["x"], torch.ones(2))
    assert isinstance(out[1], Pair)
    assert len(prefetcher) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA")
def test_prefetcher_on_cuda_delivers_device_batches_in_order() -> None:
    loader = DataLoader(dataset(16), batch_size=4)
    prefetcher = DevicePrefetcher(loader, "cuda")
    assert prefetcher.status == "on"
    got = [batch[0] for batch in prefetcher]
    assert all(t.is_cuda for t in got)
    assert torch.cat(got).cpu().tolist() == list(map(float, range(16)))


def test_cuda_present_reads_device_nodes(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidiactl").write_text("")
    assert not cuda_present(tmp_path)
    (tmp_path / "dev/nvidia0").write_text("")
    assert cuda_present(tmp_path)


class SlowItems(torch.utils.data.Dataset[int]):
    def __init__(self, count: int, wait: float) -> None:
        self.count, self.wait = count, wait

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        import time

        time.sleep(self.wait)
        return index


def test_concurrent_fetch_keeps_order_and_overlaps_waits() -> None:
    import time

    loader = build_loader(
        SlowItems(16, 0.05), LoaderDefaults(0, False, False, None, 8), batch_size=8
    )
    assert isinstance(loader.dataset, ConcurrentFetch)
    started = time.perf_counter()
    batches = [b.tolist() for b in loader]
    elapsed = time.perf_counter() - started
    assert batches == [list(range(8)), list(range(8, 16))]
    assert elapsed < 16 * 0.05 / 2  # serial reads would take 0.8 s


def test_one_fetch_thread_leaves_the_dataset_alone() -> None:
    loader = build_loader(SlowItems(4, 0.0), LoaderDefaults(0, False, False, None, 1), batch_size=2)
    assert isinstance(loader.dataset, SlowItems)
