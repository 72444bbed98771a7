"""Sizing against figures computed by hand; the arithmetic is in each case's comment.

N: GPT-2 124M = 124,439,808 (wte 50257·768 + wpe 1024·768 + 12 blocks of 7,087,872 +
final LN 1536); LLaMA-7B = 6,738,415,616 (2·32000·4096 + 32 blocks of 4·4096² +
3·4096·11008 + 2·4096, + 4096); BERT-base = 109,482,240 (30522·768 + 512·768 + 2·768
+ LN 1536 + 12·7,087,872 + pooler 590,592); MLP 784-512-256-10 = 535,818.
"""

import json

import pytest

from trainwave.cli import main
from trainwave.sizing.errors import SizingError
from trainwave.sizing.flops import step_flops
from trainwave.sizing.memory import block_activations, estimate_memory
from trainwave.sizing.recommend import recommend
from trainwave.sizing.setup import GiB, TrainingSetup
from trainwave.sizing.shapes import MLPShape, ParameterCount, TransformerShape, preset

GPT2 = preset("gpt2-124m")
LLAMA = preset("llama-7b")
BERT = preset("bert-base")
MLP = MLPShape((784, 512, 256, 10))


def make_setup(**overrides: object) -> TrainingSetup:
    return TrainingSetup(**overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "params"),
    [
        pytest.param(GPT2, 124_439_808, id="gpt2=38597376+786432+12*7087872+1536"),
        pytest.param(LLAMA, 6_738_415_616, id="llama7b=2*131072000+32*202383360+4096"),
        pytest.param(BERT, 109_482_240, id="bert=23440896+393216+1536+1536+85054464+590592"),
        pytest.param(MLP, 535_818, id="mlp=401920+131328+2570"),
    ],
)
def test_parameter_counts(model, params):
    assert model.parameters() == params


# (weights, gradients, optimizer, activations, total) in bytes.
MEMORY_CASES = [
    # bf16-mixed AdamW: 2N + 2N + (4 master + 2·4 moments)N = 12N.
    # Block, s=1024 b=8 h=768 a=12: s·b·34h + 5·a·s²·b = 213,909,504 + 503,316,480 = 717,225,984;
    # x12 = 8,606,711,808; outside: s·b·h·(1 mask + 2) = 18,874,368; logits 4·8192·50257 =
    # 1,646,821,376 -> 10,272,407,552. Counted 12,263,444,480; overhead 512 MiB +
    # 1,226,344,448 -> total 14,026,659,840.
    pytest.param(
        GPT2,
        make_setup(micro_batch=8, sequence=1024),
        (248_879_616, 248_879_616, 1_493_277_696, 10_272_407_552, 14_026_659_840),
        id="gpt2-bf16-adamw-b8-s1024",
    ),
    # Block (no dropout, SwiGLU, 2 bytes): per token 2·4h + 2·(4h + 4·11008) = 32,768 + 120,832 =
    # 153,600; x2048 = 314,572,800; scores 32·2048²·2 = 268,435,456 -> 583,008,256.
    # Full checkpointing: 32 kept inputs 2048·4096·2 = 536,870,912, + one block = 1,119,879,168;
    # outside: 2048·4096·2 = 16,777,216; logits 4·2048·32000 = 262,144,000 -> 1,398,800,384.
    # Counted 109,213,450,240; overhead 536,870,912 + 10,921,345,024 -> 120,671,666,176.
    pytest.param(
        LLAMA,
        make_setup(sequence=2048, checkpointing="full"),
        (13_476_831_232, 13_476_831_232, 80_860_987_392, 1_398_800_384, 120_671_666_176),
        id="llama7b-bf16-adamw-b1-s2048-full-ckpt",
    ),
    # ZeRO-3 over 8: every term / 8: 2N/8 = 1,684,603,904; 12N/8 = 10,107,623,424.
    pytest.param(
        LLAMA,
        make_setup(sequence=2048, checkpointing="full", data_parallel=8, zero_stage=3),
        (1_684_603_904, 1_684_603_904, 10_107_623_424, 1_398_800_384, None),
        id="llama7b-zero3-dp8",
    ),
    # TP 2 halves N to 3,369,207,808; ZeRO-1 over 4 divides only the 12 bytes: 10,107,623,424.
    pytest.param(
        LLAMA,
        make_setup(
            sequence=2048, checkpointing="full", tensor_parallel=2, data_parallel=4, zero_stage=1
        ),
        (6_738_415_616, 6_738_415_616, 10_107_623_424, None, None),
        id="llama7b-tp2-zero1-dp4",
    ),
    # fp32 Adam: 4N + 4N + 8N. Block, 4-byte activations with dropout, s=128 b=32:
    # per token 4·4h + 2h + 4·12h = 66h = 50,688; x4096 = 207,618,048; scores
    # 12·128²·32·(2·4 + 1) = 56,623,104 -> 264,241,152; x12 = 3,170,893,824;
    # outside 4096·768·(1 + 4) = 15,728,640; no LM head -> 3,186,622,464.
    pytest.param(
        BERT,
        make_setup(precision="fp32", optimizer="adam", micro_batch=32, sequence=128),
        (437_928_960, 437_928_960, 875_857_920, 3_186_622_464, None),
        id="bert-fp32-adam-b32-s128",
    ),
    # fp32 SGD+momentum: 4N each = 2,143,272; activations 64·(784+512+256+10)·4 = 399,872;
    # counted 6,829,688; overhead 536,870,912 + 682,968 -> 544,383,568.
    pytest.param(
        MLP,
        make_setup(precision="fp32", optimizer="sgd-momentum", micro_batch=64),
        (2_143_272, 2_143_272, 2_143_272, 399_872, 544_383_568),
        id="mlp-fp32-sgdm-b64",
    ),
    # Only a count: 1e9 params, pure bf16 SGD: 2 + 2 + 0 bytes, no activations.
    pytest.param(
        ParameterCount(10**9),
        make_setup(precision="bf16", optimizer="sgd", overhead_bytes=0, overhead_fraction=0.0),
        (2 * 10**9, 2 * 10**9, 0, 0, 4 * 10**9),
        id="count-1e9-bf16-sgd-no-overhead",
    ),
]


@pytest.mark.parametrize(("model", "setup", "expected"), MEMORY_CASES)
def test_memory_matches_hand_arithmetic(model, setup, expected):
    estimate = estimate_memory(model, setup)
    got = (
        estimate.weights,
        estimate.gradients,
        estimate.optimizer,
        estimate.activations,
        estimate.total,
    )
    for name, want, have in zip(
        ("weights", "gradients", "optimizer", "activations", "total"), expected, got, strict=True
    ):
        if want is not None:
            assert have == want, name


S, B, H, A = 2048, 2, 1024, 16


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        # The paper's Table 2 rows, with a GPT block (dropout, 4h MLP) in 16-bit.
        pytest.param(
            make_setup(micro_batch=B), S * B * H * 34 + 5 * A * S * S * B, id="none: sbh(34+5as/h)"
        ),
        pytest.param(
            make_setup(micro_batch=B, tensor_parallel=8),
            S * B * H * (10 + 24 // 8) + 5 * A * S * S * B // 8,
            id="tp8: sbh(10+24/t+5as/ht)",
        ),
        pytest.param(
            make_setup(micro_batch=B, tensor_parallel=8, sequence_parallel=True),
            S * B * H * 34 // 8 + 5 * A * S * S * B // 8,
            id="tp8+sp: sbh/t(34+5as/h)",
        ),
        pytest.param(
            make_setup(micro_batch=B, checkpointing="selective"),
            S * B * H * 34,
            id="selective: 34sbh",
        ),
    ],
)
def test_block_activations_reproduce_korthikanti(setup, expected):
    model = TransformerShape(layers=1, hidden=H, heads=A, vocab=32000)
    assert block_activations(model, setup, S) == expected


@pytest.mark.parametrize(
    ("model", "setup", "model_flops", "hardware_flops"),
    [
        # 6·(12·7,087,872 + 50257·768 = 123,651,840)·8192 = 6,077,735,239,680
        # + 12·12·768·1024·8192 = 927,712,935,936.
        pytest.param(
            GPT2,
            make_setup(micro_batch=8, sequence=1024),
            7_005_448_175_616,
            7_005_448_175_616,
            id="gpt2-b8",
        ),
        # 6·(32·202,383,360 + 131,072,000)·2048 = 81,190,988,021,760 + 12·32·4096·2048² =
        # 6,597,069,766,656; full recompute adds 2·6,476,267,520·2048 + 4·32·4096·2048² =
        # 28,725,815,017,472.
        pytest.param(
            LLAMA,
            make_setup(sequence=2048, checkpointing="full"),
            87_788_057_788_416,
            116_513_872_805_888,
            id="llama7b-full-ckpt",
        ),
        # 6·85,054,464·4096 + 12·12·768·128·4096 + 6·590,592·32 (pooler, once per sequence).
        pytest.param(
            BERT,
            make_setup(micro_batch=32, sequence=128),
            2_148_393_959_424,
            2_148_393_959_424,
            id="bert-b32",
        ),
        pytest.param(
            MLP,
            make_setup(micro_batch=64),
            6 * 535_818 * 64,
            6 * 535_818 * 64,
            id="mlp-6N-per-sample",
        ),
    ],
)
def test_step_flops(model, setup, model_flops, hardware_flops):
    flops = step_flops(model, setup)
    assert (flops.model, flops.hardware) == (model_flops, hardware_flops)


@pytest.mark.parametrize(
    ("model", "setup", "gpu_gib", "expected"),
    [
        # 544,383,568 B -> 3 granules of 256 MiB = 805,306,368; 16 GiB holds 21 of them.
        pytest.param(
            MLP,
            make_setup(precision="fp32", optimizer="sgd-momentum", micro_batch=64),
            16,
            ("shared", 1, 805_306_368, 21),
            id="mlp-shared-21-per-gpu",
        ),
        # 14,026,659,840 B: more than half of 24 GiB, less than all of it.
        pytest.param(
            GPT2,
            make_setup(micro_batch=8, sequence=1024),
            24,
            ("whole", 1, 24 * GiB, 1),
            id="gpt2-whole-24g",
        ),
        # 120.7 GB > 80 GiB; ZeRO-1 over 2 GPUs: 10N + act = 68,782,956,544, + overhead
        # 7,415,166,566 = 76,198,123,110 <= 85,899,345,920.
        pytest.param(
            LLAMA,
            make_setup(sequence=2048, checkpointing="full"),
            80,
            ("whole", 2, 80 * GiB, 1),
            id="llama7b-needs-2-with-zero1",
        ),
        # 1e15 params x 16 B / 4096 GPUs is still 3.9 TB per GPU.
        pytest.param(
            ParameterCount(10**15), make_setup(), 80, ("none", 0, 0, 0), id="1e15-fits-nowhere"
        ),
    ],
)
def test_recommendation(model, setup, gpu_gib, expected):
    result = recommend(model, setup, gpu_gib * GiB)
    assert (result.mode, result.gpus, result.memory_request, result.jobs_per_gpu) == expected


def test_recommendation_names_the_changes():
    result = recommend(LLAMA, make_setup(sequence=2048, checkpointing="full"), 80 * GiB)
    assert (result.setup.zero_stage, result.setup.data_parallel, result.setup.tensor_parallel) == (
        1,
        2,
        1,
    )
    assert "ZeRO stage 1 + data parallel 2" in result.reason


@pytest.mark.parametrize(
    ("build", "field", "fragment"),
    [
        pytest.param(
            lambda: make_setup(precision="fp8"), "precision", "one of fp32", id="precision"
        ),
        pytest.param(lambda: make_setup(optimizer="adamax"), "optimizer", "adamw", id="optimizer"),
        pytest.param(lambda: make_setup(micro_batch=0), "micro_batch", ">= 1", id="micro-batch"),
        pytest.param(lambda: make_setup(zero_stage=4), "zero_stage", "0, 1, 2 or 3", id="zero"),
        pytest.param(
            lambda: make_setup(checkpointing="on"), "checkpointing", "selective", id="checkpointing"
        ),
        pytest.param(
            lambda: TransformerShape(layers=2, hidden=100, heads=3, vocab=10),
            "heads",
            "divisor of hidden",
            id="heads",
        ),
        pytest.param(lambda: MLPShape((10,)), "widths", "at least an input", id="mlp-widths"),
        pytest.param(
            lambda: estimate_memory(LLAMA, make_setup(tensor_parallel=3)),
            "tensor_parallel",
            "divisor of heads (32)",
            id="tp",
        ),
        pytest.param(
            lambda: estimate_memory(MLP, make_setup(tensor_parallel=2)),
            "tensor_parallel",
            "1 for a model",
            id="tp-mlp",
        ),
        pytest.param(
            lambda: estimate_memory(LLAMA, make_setup()),
            "sequence",
            "tokens per sample",
            id="no-sequence",
        ),
        pytest.param(
            lambda: estimate_memory(GPT2, make_setup(sequence=4096)),
            "sequence",
            "positions (1024)",
            id="too-long",
        ),
        pytest.param(lambda: preset("gpt5"), "model", "gpt2-124m", id="preset"),
    ],
)
def test_errors_name_field_value_and_range(build, field, fragment):
    with pytest.raises(SizingError) as caught:
        build()
    assert caught.value.field == field
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(f"{field}: got ")


def test_cli_size_json(capsys):
    code = main(
        [
            "size",
            "--model",
            "gpt2-124m",
            "--micro-batch",
            "8",
            "--seq",
            "1024",
            "--gpu-memory-gib",
            "24",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["memory"]["total"] == 14_026_659_840
    assert out["flops"]["model"] == 7_005_448_175_616
    assert out["recommendation"]["mode"] == "whole"


def test_cli_size_text_and_errors(capsys):
    assert (
        main(
            [
                "size",
                "--mlp",
                "784,512,256,10",
                "--micro-batch",
                "64",
                "--precision",
                "fp32",
                "--gpu-memory-gib",
                "16",
            ]
        )
        == 0
    )
    assert "shared GPU" in capsys.readouterr().out
    assert main(["size", "--model", "llama-7b", "--tp", "3"]) == 2
    assert "tensor_parallel: got 3; expected a divisor of heads (32)" in capsys.readouterr().err
