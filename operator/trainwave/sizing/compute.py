"""How much of a step keeps a GPU busy: the compute bound of `trainwave size`. Pure.

Sharing a GPU pays only for a job that leaves it mostly idle. Co-located jobs
on one GPU are time-sliced by the driver: while one has kernels queued the
others wait, so two jobs that each keep a GPU busy run about twice as slowly
side by side, and nothing is gained over giving each its own GPU.

A training step is two streams that overlap (CUDA kernels run asynchronously):
the GPU's work, the step's FLOPs at the throughput the GPU sustains, and the
host's work, dispatching each PyTorch operation and launching its kernel. The
step lasts about the longer of the two, so the GPU is busy for

    busy = gpu_seconds / max(gpu_seconds, host_seconds)

of it. A large model's matmuls keep the GPU busy for the whole step (LLaMA-7B
at 4,096 tokens: ~1.6 s of GPU work against ~20 ms of host work); a small one
finishes its kernels faster than the host can launch the next (BERT-base at
1,024 tokens: ~3 ms of GPU work against ~8 ms of host work), and the GPU idles.
This is the "overhead-bound" regime of He, "Making Deep Learning Go Brrrr From
First Principles" (2022): time the GPU spends waiting for the host to issue work.

The figures the estimate rests on (each a stated assumption, not a measurement
on this machine, which has no GPU):

- peak 16-bit dense tensor throughput: the user's `--gpu-tflops`, default 312
  (NVIDIA A100 datasheet, BF16/FP16 dense; an H100 SXM is 989). fp32 training
  runs on TF32 tensor cores at half that (the same datasheets: 156 and 495).
- sustained fraction 0.5 of peak: the model FLOPs utilisation well-tuned
  large-model training reaches (PaLM 46.2%, Chowdhery et al. 2022, Table 3;
  Megatron-LM 52% of peak on A100s, Narayanan et al. SC21). Small models reach
  less, which only makes their GPU time longer than this estimate by a factor
  under two; the threshold below leaves that room.
- 10 us of host time per operation: the order of eager PyTorch's dispatch plus
  a CUDA kernel launch (He 2022's overhead section); CUDA graphs or
  torch.compile cut it, which makes a job busier than estimated here.
- operations per step: ~60 per transformer block (forward and backward: norms,
  projections, attention, MLP, residuals, dropout), 6 per MLP layer, and 50
  per step for the loss, the optimizer (foreach kernels), zero_grad and the
  input copy. A model known only by its parameter count gets the 50.

A job is light, and may share, when it keeps a GPU busy at most half of its
step: the same half the memory bound uses, so two such jobs fit one GPU's
compute as they fit its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.sizing.errors import SizingError
from trainwave.sizing.flops import StepFlops
from trainwave.sizing.setup import TrainingSetup
from trainwave.sizing.shapes import MLPShape, Model, TransformerShape

DEFAULT_GPU_TFLOPS = 312.0  # NVIDIA A100, dense BF16/FP16 tensor cores
SUSTAINED_FRACTION = 0.5  # model FLOPs utilisation of well-tuned training (PaLM, Megatron-LM)
FP32_FRACTION = 0.5  # TF32 tensor cores run at half the 16-bit rate (A100, H100 datasheets)
HOST_SECONDS_PER_OP = 10e-6  # eager PyTorch dispatch + kernel launch, order of magnitude
OPS_PER_BLOCK = 60
OPS_PER_MLP_LAYER = 6
OPS_PER_STEP = 50
LIGHT_BUSY_SHARE = 0.5  # at most half a step busy: may share (the memory bound's half too)


@dataclass(frozen=True)
class ComputeEstimate:
    """One micro-batch on one GPU: seconds of GPU work at the sustained rate, seconds
    of host work issuing it, and the rate assumed (FLOP/s)."""

    gpu_seconds: float
    host_seconds: float
    sustained_flops: float

    @property
    def busy(self) -> float:
        """Share of the step the GPU has work queued, 0-1."""
        longest = max(self.gpu_seconds, self.host_seconds)
        return self.gpu_seconds / longest if longest > 0 else 0.0

    @property
    def light(self) -> bool:
        return self.busy <= LIGHT_BUSY_SHARE

    @property
    def jobs_per_gpu(self) -> int:
        """How many such jobs one GPU's compute holds before each slows the others."""
        return max(1, int(1 / self.busy)) if self.busy > 0 else 1_000_000

    def describe(self) -> str:
        return (
            f"keeps a GPU busy about {self.busy:.0%} of a step ({seconds(self.gpu_seconds)} "
            f"of GPU work per micro-batch at {self.sustained_flops / 1e12:.0f} TFLOP/s "
            f"sustained, against {seconds(self.host_seconds)} of host work issuing it)"
        )


def estimate_compute(
    model: Model, setup: TrainingSetup, flops: StepFlops, gpu_tflops: float
) -> ComputeEstimate:
    """`gpu_tflops`: the GPU's peak dense 16-bit tensor throughput in TFLOP/s."""
    if not gpu_tflops > 0:
        raise SizingError("gpu_tflops", gpu_tflops, "a peak throughput > 0 TFLOP/s, e.g. 312")
    peak = gpu_tflops * 1e12 * (FP32_FRACTION if setup.precision == "fp32" else 1.0)
    sustained = peak * SUSTAINED_FRACTION
    return ComputeEstimate(
        gpu_seconds=flops.per_gpu(setup.tensor_parallel) / sustained,
        host_seconds=operations(model) * HOST_SECONDS_PER_OP,
        sustained_flops=sustained,
    )


def operations(model: Model) -> int:
    """PyTorch operations one training step issues on each GPU, roughly."""
    if isinstance(model, TransformerShape):
        return model.layers * OPS_PER_BLOCK + OPS_PER_STEP
    if isinstance(model, MLPShape):
        return (len(model.widths) - 1) * OPS_PER_MLP_LAYER + OPS_PER_STEP
    return OPS_PER_STEP


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.1f} ms"
