"""The compute bound of `trainwave size`: whole GPUs for steps that keep a GPU busy,
sharing only for light ones, and the "because" line naming the bound that decided.

Figures by hand (sizing/compute.py's assumptions: 312 TFLOP/s peak, half of it
sustained, 10 us of host time per op, 60 ops per block + 50 per step):
- LLaMA-7B, micro-batch 1, 4,096 tokens, full checkpointing, ZeRO-3 over 8: 2.506e14
  FLOPs per GPU / 156e12 = 1.61 s of GPU work; host 32·60 + 50 = 1,970 ops = 19.7 ms.
  Busy 100%: whole GPUs, although 17.7 GiB is under half of 80 GiB.
- BERT-base, micro-batch 8, 128 tokens: 5.371e11 / 156e12 = 3.44 ms; host 12·60 + 50 =
  770 ops = 7.7 ms. Busy 45%: may share; 1/0.447 -> 2 jobs by compute, 29 by memory.
"""

import json

import pytest

from trainwave.cli import main
from trainwave.sizing.compute import ComputeEstimate, estimate_compute, operations
from trainwave.sizing.errors import SizingError
from trainwave.sizing.flops import step_flops
from trainwave.sizing.recommend import recommend
from trainwave.sizing.setup import GiB, TrainingSetup
from trainwave.sizing.shapes import MLPShape, ParameterCount, preset

pytestmark = pytest.mark.timeout(30)

LLAMA = preset("llama-7b")
BERT = preset("bert-base")
ISSUE_SETUP = TrainingSetup(
    precision="bf16-mixed",
    optimizer="adamw",
    micro_batch=1,
    sequence=4096,
    data_parallel=8,
    zero_stage=3,
    checkpointing="full",
)
BERT_SETUP = TrainingSetup(micro_batch=8, sequence=128)


def test_a_compute_heavy_step_takes_whole_gpus_even_when_its_memory_is_small() -> None:
    result = recommend(LLAMA, ISSUE_SETUP, 80 * GiB)
    assert 2 * result.estimate.total <= 80 * GiB, "memory alone would share"
    assert (result.mode, result.gpus, result.jobs_per_gpu) == ("whole", 8, 1)
    assert result.reason.startswith("compute decided: it needs only 17.72 GiB per GPU")
    assert "busy about 100% of a step (1.61 s of GPU work" in result.reason
    assert result.compute is not None
    assert not result.compute.light


def test_a_light_step_still_shares_and_says_which_bound_sets_the_count() -> None:
    result = recommend(BERT, BERT_SETUP, 80 * GiB)
    assert result.mode == "shared"
    assert result.compute is not None
    assert result.compute.busy == pytest.approx(5.371e11 / 156e12 / 7.7e-3, rel=1e-3)
    # Memory alone would fit 29 of these (80 GiB / 2.75 GiB); compute fits 2.
    assert result.jobs_per_gpu == 2
    assert "compute bounds it to 2 such jobs per GPU" in result.reason


def test_memory_still_decides_when_the_job_does_not_fit_half_a_gpu() -> None:
    # 14.0 GB of GPT-2 on a 24 GiB GPU: more than half, so whole whatever its compute.
    result = recommend(preset("gpt2-124m"), TrainingSetup(micro_batch=8, sequence=1024), 24 * GiB)
    assert result.mode == "whole"
    assert result.reason.startswith("memory decided: needs ")


def test_a_slower_gpu_makes_the_same_step_busier() -> None:
    flops = step_flops(BERT, BERT_SETUP)
    fast = estimate_compute(BERT, BERT_SETUP, flops, 989.0)
    slow = estimate_compute(BERT, BERT_SETUP, flops, 65.0)
    assert fast.light
    assert not slow.light
    assert recommend(BERT, BERT_SETUP, 80 * GiB, gpu_tflops=65.0).mode == "whole"


@pytest.mark.parametrize(
    ("gpu", "host", "busy", "per_gpu"),
    [
        pytest.param(1.0, 0.01, 1.0, 1, id="gpu-bound"),
        pytest.param(0.002, 0.008, 0.25, 4, id="host-bound-quarter"),
        pytest.param(0.004, 0.008, 0.5, 2, id="exactly-half-is-light"),
    ],
)
def test_busy_share_and_jobs_per_gpu(gpu: float, host: float, busy: float, per_gpu: int) -> None:
    estimate = ComputeEstimate(gpu_seconds=gpu, host_seconds=host, sustained_flops=156e12)
    assert estimate.busy == pytest.approx(busy)
    assert estimate.jobs_per_gpu == per_gpu
    assert estimate.light == (busy <= 0.5)


def test_operations_by_model_kind() -> None:
    assert operations(LLAMA) == 32 * 60 + 50
    assert operations(MLPShape((784, 512, 256, 10))) == 3 * 6 + 50
    assert operations(ParameterCount(10**9)) == 50


def test_fp32_runs_at_the_tf32_rate() -> None:
    setup = TrainingSetup(precision="fp32", micro_batch=8, sequence=128)
    flops = step_flops(BERT, setup)
    assert estimate_compute(BERT, setup, flops, 312.0).sustained_flops == 78e12


def test_a_throughput_of_zero_is_refused_naming_the_field() -> None:
    with pytest.raises(SizingError, match=r"gpu_tflops: got 0\.0"):
        estimate_compute(BERT, BERT_SETUP, step_flops(BERT, BERT_SETUP), 0.0)


def test_cli_the_issue_command_recommends_whole_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["size", "--model", "llama-7b", "--precision", "bf16-mixed", "--optimizer", "adamw",
            "--micro-batch", "1", "--seq", "4096", "--dp", "8", "--zero", "3",
            "--checkpointing", "full"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "recommendation: 8 whole GPU(s)" in out
    assert "because: compute decided" in out
    assert main([*argv, "--json"]) == 0
    compute = json.loads(capsys.readouterr().out)["compute"]
    assert compute["light"] is False
    assert compute["busy"] == 1.0


def test_cli_a_small_model_still_shares(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--model", "bert-base", "--micro-batch", "8", "--seq", "128"]) == 0
    out = capsys.readouterr().out
    assert "recommendation: shared GPU, request 2.75 GiB on each of 1 GPU(s); 2 such" in out
    assert "GPU busy: keeps a GPU busy about 45% of a step" in out
