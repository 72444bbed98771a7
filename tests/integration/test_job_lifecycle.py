"""A TrainingJob's life on the real control plane: start, fail, restart, finish, clean up."""

import json
import time
from datetime import datetime, timedelta

import pytest

from integration.node_pools import node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    env_of,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_gang_starts_with_the_torch_contract_and_succeeds(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("ok", workers=2, gpus=4, processesPerWorker=4,
                                           run_for="3s"))  # fmt: skip

    running = wait_for_phase(cluster, namespace, "ok", ("Running", "Succeeded"))
    pods = {
        p["metadata"]["labels"]["trainwave.io/rank"]: p
        for p in worker_pods(cluster, namespace, "ok")
    }
    assert sorted(pods) == ["0", "1"]
    second = pods["1"]
    assert second["metadata"]["name"] == "ok-a0-worker-1"
    assert second["spec"]["hostname"] == "ok-worker-1"
    assert second["spec"]["subdomain"] == "ok"
    assert second["metadata"]["ownerReferences"][0]["uid"] == running["metadata"]["uid"]
    env = env_of(second)
    assert env["MASTER_ADDR"] == "ok-worker-0.ok"
    assert (env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"]) == ("8", "4", "1")
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["LOCAL_WORLD_SIZE"]) == (
        "2",
        "4",
        "4",
    )
    worker = next(c for c in second["spec"]["containers"] if c["name"] == "worker")
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "4"

    # Created in the reconcile that saw every worker's address, just after its status write.
    service = wait_until(lambda: service_of(cluster, namespace, "ok"), 10, "the Service")
    assert service["spec"]["clusterIP"] == "None"
    assert "selector" not in service["spec"], "the operator writes its EndpointSlice"

    done = wait_for_phase(cluster, namespace, "ok", "Succeeded")
    status = done["status"]
    assert status["restarts"] == 0
    assert status["startTime"] <= status["completionTime"]
    assert status["observedGeneration"] == done["metadata"]["generation"]
    assert condition(done, "Succeeded")["status"] == "True"
    assert condition(done, "Running")["status"] == "False"

    def reasons():
        found = {e["reason"] for e in get_json(cluster, namespace, "events")["items"]
                 if e["involvedObject"]["name"] == "ok"}  # fmt: skip
        return found if {"AllWorkersRunning", "Succeeded"} <= found else None

    # "Created" (job accepted) only if a written status showed that phase: a gang created
    # placed whose first written status is Running has no such Event.
    wait_until(reasons, 15, "AllWorkersRunning and Succeeded Events")


def service_of(cluster, namespace, name):
    found = cluster.kubectl("get", "service", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def test_the_endpoints_name_a_placed_gang_and_not_a_held_one(cluster, namespace, running_operator):
    """A gang held behind the gate has no addresses and no endpoints; the Service itself
    comes with the pods, so that the reconcile that names them writes only the slice. When
    worker 0 is named ahead of the rest: test_endpoints_worker_0_first.py."""
    nowhere = {"nodeSelector": {"trainwave.test/pool": "nowhere"}}
    apply(cluster, namespace, job_manifest("held", workers=2, result=None, template_spec=nowhere))
    apply(cluster, namespace, job_manifest("went", workers=3, result=None))
    wait_until(lambda: len(worker_pods(cluster, namespace, "held")) == 2, 30, "held's workers")
    wait_for_phase(cluster, namespace, "went", "Running")
    service = wait_until(lambda: service_of(cluster, namespace, "went"), 10, "went's Service")
    assert service["metadata"]["ownerReferences"][0]["name"] == "went"

    def endpoints():
        slices = get_json(cluster, namespace, "endpointslices",
                          "-l", "kubernetes.io/service-name=went")["items"]  # fmt: skip
        names = sorted(e.get("hostname", "") for s in slices for e in s.get("endpoints") or [])
        return names if len(names) == 3 else None

    assert wait_until(endpoints, 20, "went's 3 endpoints") == [f"went-worker-{r}" for r in range(3)]
    held = job(cluster, namespace, "held")
    assert held["status"]["phase"] == "Scheduling", held["status"]
    assert all(p["spec"].get("schedulingGates") for p in worker_pods(cluster, namespace, "held"))
    assert (
        service_of(cluster, namespace, "held")["metadata"]["ownerReferences"][0]["name"] == "held"
    )
    assert endpoint_slices(cluster, namespace, "held") == []


def endpoint_slices(cluster, namespace, name):
    return get_json(cluster, namespace, "endpointslices",
                    "-l", f"kubernetes.io/service-name={name}")["items"]  # fmt: skip


def test_a_restarted_gang_s_names_lead_only_to_the_new_gang(cluster, namespace, running_operator):
    """A recreated gang gets a Service of its own, so names no DNS cache has seen; the
    previous attempt's Service goes, and its slice with it (builders/service.py)."""
    apply(cluster, namespace, job_manifest("again", workers=2, result=None))
    wait_for_phase(cluster, namespace, "again", "Running")

    def named(service, attempt, count):
        slices = endpoint_slices(cluster, namespace, service)
        pods = sorted(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [])
        labelled = {s["metadata"]["labels"].get("trainwave.io/attempt") for s in slices}
        return pods if labelled == {str(attempt)} and len(pods) == count else None

    assert wait_until(lambda: named("again", 0, 2), 20, "attempt 0's 2 workers named") == [
        "again-a0-worker-0",
        "again-a0-worker-1",
    ]
    # One slice, the operator's: kube-controller-manager writes none for this Service.
    (only,) = endpoint_slices(cluster, namespace, "again")
    assert only["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "trainwave.io"
    cluster.kubectl("delete", "pod", "-n", namespace, "again-a0-worker-1", "--wait=false")
    wait_until(lambda: job(cluster, namespace, "again")["status"].get("attempt") == 1, 60,
               "attempt 1")  # fmt: skip
    assert wait_until(lambda: named("again-a1", 1, 2), 30, "attempt 1's 2 workers named") == [
        "again-a1-worker-0",
        "again-a1-worker-1",
    ]
    pod = get_json(cluster, namespace, "pod", "again-a1-worker-1")
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("again-worker-1", "again-a1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "again-worker-0.again-a1"
    wait_until(
        lambda: service_of(cluster, namespace, "again") is None, 30, "attempt 0's Service gone"
    )
    wait_until(lambda: not endpoint_slices(cluster, namespace, "again"), 30, "and its slice")


def test_slices_kube_controller_manager_wrote_before_an_upgrade_are_deleted(
    cluster, namespace, running_operator
):
    """An operator before this one gave each job's Service a selector, so
    kube-controller-manager wrote its EndpointSlices. It leaves them when the selector goes,
    naming the same hostnames: the operator removes the selector and deletes them."""
    apply(cluster, namespace, job_manifest("upgraded", workers=2, result=None))
    wait_for_phase(cluster, namespace, "upgraded", "Running")
    wait_until(lambda: endpoint_slices(cluster, namespace, "upgraded"), 20, "its EndpointSlice")
    service = service_of(cluster, namespace, "upgraded")
    selector = {"trainwave.io/job-name": "upgraded", "trainwave.io/role": "worker",
                "trainwave.io/attempt": "0"}  # fmt: skip
    port = service["spec"]["ports"][0]
    before = {  # what the earlier operator applied, under the same field manager
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {k: service["metadata"][k] for k in ("name", "labels", "ownerReferences")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{k: port[k] for k in ("name", "port", "targetPort")}],
        },
    }
    # The earlier operator's Service, created with its selector, was single-stack; one
    # created without a selector is RequireDualStack, which a selector may not have here.
    cluster.kubectl("patch", "service", "upgraded", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"ipFamilyPolicy": "SingleStack"}}))  # fmt: skip
    applied = cluster.kubectl("apply", "-n", namespace, "--server-side", "--field-manager=trainwave",
                              "--force-conflicts", "-f", "-", input=json.dumps(before),
                              check=False)  # fmt: skip
    assert applied.returncode == 0, applied.stderr

    seen = []  # what the last look found, for the failure's message

    def only_ours():
        """The one slice left, if the selector is gone and it is the operator's alone."""
        found = service_of(cluster, namespace, "upgraded")
        slices = endpoint_slices(cluster, namespace, "upgraded")
        managers = [
            (
                s["metadata"]["name"],
                s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            )
            for s in slices
        ]
        endpoints = [
            e["metadata"]["name"] for e in get_json(cluster, namespace, "endpoints")["items"]
        ]
        seen[:] = [found["spec"].get("selector"), managers, endpoints]
        if "selector" in found["spec"] or [m for _, m in managers] != ["trainwave.io"]:
            return None
        if endpoints:  # left, kube-controller-manager's mirroring controller writes them again
            return None
        return sorted(e["hostname"] for e in slices[0]["endpoints"])

    # kube-controller-manager writes a slice for the selector at once; the operator sees it
    # (it carries the Service's labels), and only then acts: nothing else woke it.
    # kube-controller-manager may write its slice once more from a view that still had the
    # selector, after the operator deleted the first: that one goes too. Its Endpoints for
    # the selector must go as well: left, its mirroring controller copied them into a slice
    # of its own, written again each time the operator deleted it (found in CI). So the end
    # state is read twice, 3 s apart, and both reads are part of the wait.
    def settled():
        first = only_ours()
        return first if first and (time.sleep(3) or only_ours() == first) else None

    try:
        names = wait_until(settled, 90, "the selector gone and only the operator's slice left")
    except AssertionError as error:
        raise AssertionError(f"{error}; selector, slices, Endpoints last seen: {seen}") from None
    assert names == ["upgraded-worker-0", "upgraded-worker-1"]


def test_a_deleted_service_comes_back_with_its_endpoints(cluster, namespace, running_operator):
    """The slice is owned by the Service, as kube-controller-manager's are: deleting the
    Service takes the names away, and the operator writes both again."""
    apply(cluster, namespace, job_manifest("named", workers=2, result=None))
    wait_for_phase(cluster, namespace, "named", "Running")
    first = wait_until(lambda: service_of(cluster, namespace, "named"), 10, "the Service")
    wait_until(lambda: endpoint_slices(cluster, namespace, "named"), 20, "its EndpointSlice")
    cluster.kubectl("delete", "service", "named", "-n", namespace, "--wait=true")

    again = wait_until(
        lambda: named_anew(cluster, namespace, "named", first["metadata"]["uid"], 2),
        60,
        "the Service and its slice again",
    )
    assert again == ["named-worker-0", "named-worker-1"]


def test_a_service_deleted_before_its_gang_ran_comes_back_with_its_endpoints(
    cluster, namespace, running_operator
):
    """The Service comes with the pods and the slice later takes its UID: deleted between
    the two, the slice names a dead owner, garbage collection removes it, and the operator
    applies both again."""
    later = {"trainwave.test/later": "yes"}
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        template = {"nodeSelector": {**pool.selector, **later}}
        apply(cluster, namespace, job_manifest("late", workers=2, result=None,
                                               template_spec=template))  # fmt: skip
        first = wait_until(lambda: service_of(cluster, namespace, "late"), 30, "the Service")
        wait_for_phase(cluster, namespace, "late", "Scheduling")  # gated: no node matches yet
        cluster.kubectl("delete", "service", "late", "-n", namespace, "--wait=true")
        cluster.kubectl("label", "node", pool.nodes[0], "trainwave.test/later=yes")
        wait_for_phase(cluster, namespace, "late", "Running")

        again = wait_until(
            lambda: named_anew(cluster, namespace, "late", first["metadata"]["uid"], 2),
            60,
            "the Service and its slice again",
        )
        assert again == ["late-worker-0", "late-worker-1"]


def named_anew(cluster, namespace, name, old_uid, workers):
    """The hostnames the job's slice names, once a Service other than `old_uid` owns it
    and it names all `workers`."""
    found = service_of(cluster, namespace, name)
    if not found or found["metadata"]["uid"] == old_uid:
        return None
    slices = endpoint_slices(cluster, namespace, name)
    owners = {o["uid"] for s in slices for o in s["metadata"]["ownerReferences"]}
    hosts = sorted(e["hostname"] for s in slices for e in s.get("endpoints") or [])
    return hosts if owners == {found["metadata"]["uid"]} and len(hosts) == workers else None


def test_worker_failure_restarts_the_whole_gang_until_max_restarts(
    cluster, namespace, running_operator
):
    apply(cluster, namespace, job_manifest(
        "crashy", workers=2, result="Failed", exit_code=1, run_for="1s",
        run_policy={"failurePolicy": {"maxRestarts": 2}},
    ))  # fmt: skip

    failed = wait_for_phase(cluster, namespace, "crashy", "Failed", timeout=120)
    status = failed["status"]
    assert status["reason"] == "MaxRestartsExceeded"
    assert (status["restarts"], status["attempt"]) == (2, 2)
    assert "exited with code 1" in status["message"]
    # The last attempt's failed pods stay for their logs; older attempts are cleaned up.
    attempts = {p["metadata"]["labels"]["trainwave.io/attempt"] for p in worker_pods(cluster, namespace, "crashy")
                if not p["metadata"].get("deletionTimestamp")}  # fmt: skip
    assert attempts <= {"1", "2"}

    def worker_failed_events():
        return [e for e in get_json(cluster, namespace, "events")["items"]
                if e["involvedObject"]["name"] == "crashy" and e["reason"] == "WorkerFailed"]  # fmt: skip

    wait_until(lambda: len(worker_failed_events()) >= 2, 15, "two WorkerFailed Events")
    restarts = worker_failed_events()
    assert len(restarts) == 2
    assert all(e["type"] == "Warning" for e in restarts)


RULES = [
    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}},
    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
]


def test_fail_job_rule_fails_at_once(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest(
        "usererror", workers=2, result="Failed", exit_code=3, run_for="1s",
        run_policy={"failurePolicy": {"maxRestarts": 5, "rules": RULES}},
    ))  # fmt: skip
    failed = wait_for_phase(cluster, namespace, "usererror", "Failed")
    assert failed["status"]["reason"] == "FailedByRule"
    assert (failed["status"]["restarts"], failed["status"]["attempt"]) == (0, 0)
    assert "failurePolicy.rules[0]" in failed["status"]["message"]


def test_ignore_rule_restarts_without_counting(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest(
        "preempted", workers=2, result="Failed", exit_code=137, run_for="1s",
        run_policy={"failurePolicy": {"maxRestarts": 0, "rules": RULES}},
    ))  # fmt: skip

    def restarted_twice():
        body = job(cluster, namespace, "preempted")
        return body if body.get("status", {}).get("attempt", 0) >= 2 else None

    body = wait_until(restarted_twice, 90, "two uncounted gang restarts")
    assert body["status"]["restarts"] == 0
    assert body["status"]["phase"] != "Failed"


def test_suspend_stops_workers_and_resume_starts_a_new_gang(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("pausable", workers=2, run_for="30s",
                                           run_policy={"suspend": True}))  # fmt: skip
    suspended = wait_for_phase(cluster, namespace, "pausable", "Suspended")
    assert worker_pods(cluster, namespace, "pausable") == []
    assert condition(suspended, "Suspended")["status"] == "True"

    cluster.kubectl("patch", "tj", "pausable", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"runPolicy":{"suspend":false}}}')  # fmt: skip
    running = wait_for_phase(cluster, namespace, "pausable", "Running")
    assert running["status"]["attempt"] == 1
    assert running["status"]["restarts"] == 0

    cluster.kubectl("patch", "tj", "pausable", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"runPolicy":{"suspend":true}}}')  # fmt: skip
    wait_for_phase(cluster, namespace, "pausable", "Suspended")
    wait_until(lambda: worker_pods(cluster, namespace, "pausable") == [], 30, "workers deleted")
    # While suspended, the pod-shaping fields may change.
    cluster.kubectl("patch", "tj", "pausable", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"workers":1}}')  # fmt: skip


def test_active_deadline_fails_the_job_and_stops_its_workers(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("slow", workers=2, result=None,
                                           run_policy={"activeDeadlineSeconds": 4}))  # fmt: skip
    failed = wait_for_phase(cluster, namespace, "slow", "Failed", timeout=60)
    assert failed["status"]["reason"] == "DeadlineExceeded"
    wait_until(lambda: worker_pods(cluster, namespace, "slow") == [], 30, "running workers stopped")


def test_max_run_stops_the_gang_its_bound_after_placement(cluster, namespace, running_operator):
    """runPolicy.maxRunSeconds: the pods carry the bound the queue counts on, and the gang
    is stopped that long after its release, not after the job's start."""
    apply(cluster, namespace, job_manifest("bounded", workers=2, result=None,
                                           run_policy={"maxRunSeconds": 4}))  # fmt: skip
    wait_for_phase(cluster, namespace, "bounded", "Running")
    pods = worker_pods(cluster, namespace, "bounded")
    notes = [p["metadata"]["annotations"] for p in pods]
    assert {n[contract.ANNOTATION_MAX_RUN_SECONDS] for n in notes} == {"4"}
    released = min(datetime.fromisoformat(n[contract.ANNOTATION_RELEASED_AT]) for n in notes)
    failed = wait_for_phase(cluster, namespace, "bounded", "Failed", timeout=60)
    assert failed["status"]["reason"] == "DeadlineExceeded"
    assert "runPolicy.maxRunSeconds (4s)" in failed["status"]["message"]
    assert datetime.fromisoformat(failed["status"]["completionTime"]) >= released + timedelta(
        seconds=4
    )
    wait_until(lambda: worker_pods(cluster, namespace, "bounded") == [], 30, "workers stopped")


def test_ttl_deletes_the_finished_job_and_garbage_collection_its_children(
    cluster, namespace, running_operator
):
    apply(cluster, namespace, job_manifest("brief", run_policy={"ttlSecondsAfterFinished": 2}))
    wait_for_phase(cluster, namespace, "brief", "Succeeded")
    wait_until(
        lambda: cluster.kubectl("get", "tj", "brief", "-n", namespace, check=False).returncode != 0,
        60, "the job deleted by its TTL",
    )  # fmt: skip
    wait_until(lambda: worker_pods(cluster, namespace, "brief") == [], 60, "pods collected")


def test_deleting_a_running_job_deletes_its_pods_and_service(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("doomed", workers=3, result=None))
    wait_for_phase(cluster, namespace, "doomed", "Running")
    wait_until(lambda: service_of(cluster, namespace, "doomed"), 10, "the Service")
    cluster.kubectl("delete", "tj", "doomed", "-n", namespace, "--wait=true")
    wait_until(lambda: worker_pods(cluster, namespace, "doomed") == [], 60, "pods collected")
    wait_until(
        lambda: cluster.kubectl("get", "svc", "doomed", "-n", namespace, check=False).returncode != 0,
        60, "service collected",
    )  # fmt: skip
