"""GPU-sharing packing (trainwave.placement.packing / fragmentation): pure, hand-checked cases."""

from __future__ import annotations

import pytest

from trainwave.placement.fragmentation import (
    FragmentationMeasure,
    Shape,
    TypicalShapes,
    typical_shapes,
)
from trainwave.placement.packing import (
    BestFit,
    Choice,
    Fgd,
    FgdConsolidate,
    NodeState,
    Policy,
    Task,
    assign,
    choose,
    fgd_score,
    fits,
    tightest_gpu,
    whole_gpus,
)

pytestmark = pytest.mark.timeout(5)

SHARE = Shape(1000, 500, 1)  # half a GPU
WHOLE = Shape(1000, 1000, 1)
CPU_ONLY = Shape(4000, 0, 0)


def make_node(
    name: str = "n",
    gpus: tuple[int, ...] = (1000, 1000),
    model: str = "T4",
    cpu: int = 8000,
    memory: int = 64_000,
) -> NodeState:
    return NodeState(name, model, cpu, memory, gpus)


def make_task(
    gpu_milli: int = 0, num_gpu: int | None = None, cpu: int = 1000, memory: int = 1000,
    models: str = "",
) -> Task:  # fmt: skip
    count = (1 if gpu_milli else 0) if num_gpu is None else num_gpu
    return Task(cpu, memory, count, gpu_milli, frozenset(m for m in models.split("|") if m))


def measure(*weighted: tuple[Shape, float]) -> FragmentationMeasure:
    return FragmentationMeasure(TypicalShapes(weighted))


# --- tasks and filters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"num_gpu": 2, "gpu_milli": 500}, "only possible on one GPU", id="fraction-on-two"),
        pytest.param({"num_gpu": 1, "gpu_milli": 0}, "both 0 or both > 0", id="count-without-milli"),
        pytest.param({"num_gpu": 1, "gpu_milli": 1500}, "0..1000", id="milli-above-one-gpu"),
        pytest.param({"num_gpu": -1, "gpu_milli": 0}, ">= 0", id="negative"),
    ],
)  # fmt: skip
def test_task_rejects_impossible_requests(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Task(cpu_milli=1000, memory=1000, **kwargs)


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        pytest.param(make_node(), make_task(), True, id="cpu-only"),
        pytest.param(make_node(cpu=500), make_task(), False, id="cpu-short"),
        pytest.param(make_node(memory=500), make_task(), False, id="memory-short"),
        pytest.param(make_node(gpus=(300, 600)), make_task(600), True, id="share-exact-room"),
        pytest.param(make_node(gpus=(300, 599)), make_task(600), False, id="share-no-gpu-with-room"),
        pytest.param(make_node(gpus=(500, 500)), make_task(1000), False, id="whole-needs-free-gpu"),
        pytest.param(make_node(gpus=(1000, 999, 1000)), make_task(1000, 2), True, id="two-whole"),
        pytest.param(make_node(gpus=(1000, 999)), make_task(1000, 2), False, id="two-whole-short"),
        pytest.param(make_node(gpus=()), make_task(100), False, id="cpu-node-gpu-task"),
        pytest.param(make_node(gpus=()), make_task(), True, id="cpu-node-cpu-task"),
        pytest.param(make_node(model="T4"), make_task(500, models="V100M16|V100M32"), False, id="model-refused"),
        pytest.param(make_node(model="V100M32"), make_task(500, models="V100M16|V100M32"), True, id="model-allowed"),
        pytest.param(make_node(model="T4"), make_task(models="V100M16"), True, id="models-ignored-without-gpu"),
    ],
)  # fmt: skip
def test_filters(node: NodeState, task: Task, expected: bool) -> None:
    assert fits(node, task) is expected
    assert (choose(BestFit(), [node], task) is not None) is expected
    assert (choose(Fgd(measure((SHARE, 1.0))), [node], task) is not None) is expected


@pytest.mark.parametrize(
    ("gpus", "milli", "expected"),
    [
        pytest.param((1000, 600, 700), 500, 1, id="tightest"),
        pytest.param((600, 1000, 600), 500, 0, id="lowest-index-on-ties"),
        pytest.param((400, 300), 500, -1, id="none"),
    ],
)  # fmt: skip
def test_tightest_gpu(gpus: tuple[int, ...], milli: int, expected: int) -> None:
    assert tightest_gpu(gpus, milli) == expected


def test_whole_gpus_are_the_first_free_ones() -> None:
    assert whole_gpus((1000, 300, 1000, 1000), 2) == (0, 2)


@pytest.mark.parametrize(
    ("task", "gpus", "expected_gpus", "cpu", "memory"),
    [
        pytest.param(make_task(300), (1,), (1000, 700), 7000, 63_000, id="share"),
        pytest.param(make_task(1000, 2), (0, 1), (0, 0), 7000, 63_000, id="two-whole"),
        pytest.param(make_task(), (), (1000, 1000), 7000, 63_000, id="cpu-only"),
    ],
)  # fmt: skip
def test_assign_takes_what_was_asked(
    task: Task, gpus: tuple[int, ...], expected_gpus: tuple[int, ...], cpu: int, memory: int
) -> None:
    after = assign(make_node(), task, gpus)
    assert (after.gpu_free, after.cpu_free, after.memory_free) == (expected_gpus, cpu, memory)


@pytest.mark.parametrize(
    ("task", "gpus"),
    [
        pytest.param(make_task(300), (), id="missing-gpu"),
        pytest.param(make_task(300), (0, 1), id="too-many-gpus"),
        pytest.param(make_task(1000, 2), (0, 0), id="same-gpu-twice"),
        pytest.param(make_task(cpu=9000), (), id="over-cpu"),
    ],
)  # fmt: skip
def test_assign_refuses_what_does_not_fit(task: Task, gpus: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"GPU|does not fit"):
        assign(make_node(), task, gpus)


# --- typical shapes and FGD's fragmentation, computed by hand -----------------------------


def test_typical_shapes_cover_95_percent_and_renormalise() -> None:
    shapes = [SHARE] * 16 + [CPU_ONLY] + [WHOLE] * 3  # 95% of 20 tasks = 19: SHARE and WHOLE
    assert typical_shapes(shapes).weighted == ((SHARE, 16 / 19), (WHOLE, 3 / 19))
    assert typical_shapes(shapes, coverage=1).weighted == (
        (SHARE, 0.8),
        (WHOLE, 0.15),
        (CPU_ONLY, 0.05),
    )
    assert typical_shapes(shapes, coverage=0.8).weighted == ((SHARE, 1.0),)


def test_typical_shapes_break_equal_counts_towards_the_larger_shape() -> None:
    assert typical_shapes([SHARE, WHOLE], coverage=0.5).weighted == ((WHOLE, 1.0),)


@pytest.mark.parametrize(
    ("typical", "node", "expected"),
    [
        # Both shapes fit; only GPU 1 (300 free) is too small for either: 0.5*300 + 0.5*300.
        pytest.param(((SHARE, 0.5), (WHOLE, 0.5)), make_node(gpus=(1000, 300)), 300, id="stranded-gpu"),
        # Half a GPU still fits on GPU 0; a whole GPU fits nowhere: 0.5*300 + 0.5*(500+300).
        pytest.param(((SHARE, 0.5), (WHOLE, 0.5)), make_node(gpus=(500, 300)), 550, id="whole-fits-nowhere"),
        # A CPU-only shape leaves every idle GPU idle: 0.5*1300 + 0.5*300.
        pytest.param(((CPU_ONLY, 0.5), (SHARE, 0.5)), make_node(gpus=(1000, 300)), 800, id="cpu-only-shape"),
        pytest.param(((Shape(16000, 500, 1), 1.0),), make_node(gpus=(1000, 300)), 1300, id="shape-lacks-cpu"),
        pytest.param(((Shape(1000, 500, 1, "V100M16"), 1.0),), make_node(gpus=(1000, 300)), 1300, id="model-refused"),
        pytest.param(((Shape(1000, 500, 1, "V100M16"), 1.0),), make_node(gpus=(1000, 300), model="V100M16"), 300, id="model-allowed"),
        pytest.param(((Shape(1000, 1000, 2), 1.0),), make_node(gpus=(1000, 300)), 1300, id="two-gpus-short"),
        pytest.param(((Shape(1000, 1000, 2), 1.0),), make_node(gpus=(1000, 1000, 300)), 300, id="two-gpus-fit"),
        pytest.param(((SHARE, 1.0),), make_node(gpus=(0, 0)), 0, id="nothing-idle"),
    ],
)  # fmt: skip
def test_fragmentation(
    typical: tuple[tuple[Shape, float], ...], node: NodeState, expected: float
) -> None:
    frag = measure(*typical).of(node.gpu_model, node.cpu_free, node.gpu_free)
    assert frag == pytest.approx(expected)


def test_fragmentation_ignores_gpu_order() -> None:
    frag = measure((SHARE, 0.5), (WHOLE, 0.5))
    assert frag.of("T4", 8000, (300, 1000, 500)) == frag.of("T4", 8000, (1000, 500, 300))


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param(300, 300, 50, id="unchanged"),
        pytest.param(300, 550, 43, id="worse"),  # int(100 / (1 + e^0.25)) = int(43.78)
        pytest.param(250, 0, 56, id="better"),  # int(100 / (1 + e^-0.25)) = int(56.22)
        pytest.param(0, 8000, 0, id="much-worse"),
        pytest.param(8000, 0, 99, id="much-better-never-100"),
        pytest.param(0, 1e9, 0, id="overflow-safe"),
    ],
)  # fmt: skip
def test_fgd_score(before: float, after: float, expected: int) -> None:
    assert fgd_score(before, after) == expected


# --- choosing a node and a GPU ----------------------------------------------------------------


def test_fgd_picks_the_gpu_that_keeps_fragmentation_low_where_best_fit_packs_tightest() -> None:
    node, task = make_node(gpus=(1000, 600)), make_task(500)
    # FGD: GPU 0 -> (500, 600) strands nothing: score 50; GPU 1 -> (1000, 100) strands 100:
    # int(100 * sigmoid(-0.1)) = 47. Best-fit: the tightest GPU, and 1 - (0.5 * 7000 / 128000
    # + 0.5 * 1100 / 8000) = 0.9039 -> 90.
    assert choose(Fgd(measure((SHARE, 1.0))), [node], task) == Choice("n", (0,), (50.0,))
    assert choose(BestFit(), [node], task) == Choice("n", (1,), (90.0,))


@pytest.mark.parametrize(
    ("names", "winner"),
    [
        pytest.param(("b", "a", "c"), "a", id="plain"),
        pytest.param(("0007-openb-node-0001", "0003-openb-node-0999"), "0003-openb-node-0999", id="simulator-prefix"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("policy", [BestFit(), Fgd(measure((SHARE, 1.0)))], ids=["best-fit", "fgd"])
def test_equal_scores_go_to_the_smallest_name(
    names: tuple[str, ...], winner: str, policy: Policy
) -> None:
    nodes = [make_node(name) for name in names]
    choice = choose(policy, nodes, make_task(500))
    assert choice is not None
    assert choice.node == winner


def test_best_fit_prefers_the_fuller_node() -> None:
    nodes = [make_node("a"), make_node("b", gpus=(1000, 400))]
    assert choose(BestFit(), nodes, make_task(300)) == Choice("b", (1,), (90.0,))


@pytest.mark.parametrize("policy", [BestFit(), Fgd(measure((WHOLE, 1.0)))], ids=["best-fit", "fgd"])
def test_whole_gpu_tasks_get_free_gpus_lowest_index_first(policy: Policy) -> None:
    node = make_node(gpus=(400, 1000, 1000, 1000))
    choice = choose(policy, [node], make_task(1000, 2))
    assert choice is not None
    assert choice.gpus == (1, 2)


@pytest.mark.parametrize("policy", [BestFit(), Fgd(measure((SHARE, 1.0)))], ids=["best-fit", "fgd"])
def test_gpu_models_restrict_the_nodes(policy: Policy) -> None:
    nodes = [
        make_node("a", model="T4"),
        make_node("b", model="V100M32"),
        make_node("c", model="P100"),
    ]
    choice = choose(policy, nodes, make_task(500, models="V100M32|P100"))
    assert choice is not None
    assert choice.node == "b"
    assert choose(policy, nodes, make_task(500, models="A100")) is None


# --- fgd-consolidate's tie-break -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "task", "fgd", "consolidated"),
    [
        # CPU-only: F does not move anywhere (score 50 on both); fgd-consolidate prefers the node
        # whose GPUs are all taken, FGD the smaller name.
        pytest.param((make_node("a"), make_node("b", gpus=(0, 0))), make_task(), "a", "b", id="cpu-task-to-busy-gpus"),
        # Half a GPU: 50 on both (nothing stranded either way); it fills the started node.
        pytest.param((make_node("a"), make_node("b", gpus=(500, 1000))), make_task(500), "a", "b", id="gpu-task-to-started-node"),
    ],
)  # fmt: skip
def test_fgd_consolidate_breaks_fgd_ties_towards_consolidation(
    nodes: tuple[NodeState, ...], task: Task, fgd: str, consolidated: str
) -> None:
    typical = measure((SHARE, 1.0))
    fgd_choice = choose(Fgd(typical), nodes, task)
    tw_choice = choose(FgdConsolidate(typical), nodes, task)
    assert fgd_choice is not None
    assert tw_choice is not None
    assert (fgd_choice.node, fgd_choice.score) == (fgd, (50.0,))
    assert (tw_choice.node, tw_choice.score[0]) == (consolidated, 50.0)


# --- end to end on a synthetic 3-node cluster -------------------------------------------------

CLUSTER = (make_node("a"), make_node("b", gpus=(1000,)), make_node("c", gpus=(), model=""))
ARRIVALS = (make_task(500), make_task(cpu=2000), make_task(1000), make_task(1000), make_task(500),
            make_task(1000))  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # 1: both GPU nodes score 43 (a whole GPU would be stranded) -> a; 2: CPU-only, 50
        # everywhere -> a; 3: a keeps F at 250, b at 0, both 50 -> a; 4: only b has a free GPU;
        # 5: closes a's half GPU (score 56); 6: no free GPU left.
        pytest.param(Fgd(measure((SHARE, 0.5), (WHOLE, 0.5))),
                     [("a", (0,)), ("a", ()), ("a", (1,)), ("b", (0,)), ("a", (0,)), None], id="fgd"),
        # Same scores; 2 goes to the GPU-less node c, 3 to the started node a.
        pytest.param(FgdConsolidate(measure((SHARE, 0.5), (WHOLE, 0.5))),
                     [("a", (0,)), ("c", ()), ("a", (1,)), ("b", (0,)), ("a", (0,)), None], id="fgd-consolidate"),
        # 1: b leaves least (94 vs 87); 2: c (97); 3-4: only a has free GPUs; 5: b.
        pytest.param(BestFit(),
                     [("b", (0,)), ("c", ()), ("a", (0,)), ("a", (1,)), ("b", (0,)), None], id="best-fit"),
    ],
)  # fmt: skip
def test_end_to_end_on_three_nodes(
    policy: Policy, expected: list[tuple[str, tuple[int, ...]] | None]
) -> None:
    nodes = {n.name: n for n in CLUSTER}
    placed: list[tuple[str, tuple[int, ...]] | None] = []
    for task in ARRIVALS:
        choice = choose(policy, nodes.values(), task)
        placed.append(None if choice is None else (choice.node, choice.gpus))
        if choice is not None:
            nodes[choice.node] = assign(nodes[choice.node], task, choice.gpus)
    assert placed == expected
    assert sum(sum(n.gpu_free) for n in nodes.values()) == 0, "all 3 GPUs end up allocated"
    assert all(not fits(n, ARRIVALS[-1]) for n in nodes.values()), "the last task fits nowhere"
