"""Which trainwave feature needs which Pod Security level, for a refused worker. Pure.

When Pod Security Admission refuses a worker, the API server lists every
check the pod failed, e.g. (kube-apiserver 1.34, namespace enforcing
"baseline"):

    pods "demo-a0-worker-0" is forbidden: violates PodSecurity "baseline:latest":
    non-default capabilities (container "worker" must not include "IPC_LOCK" in
    securityContext.capabilities.add), host namespaces (hostNetwork=true), hostPort
    (container "worker" uses hostPort 29500)

That names capabilities and fields, not the job setting that put them there.
This adds, to the job's FailedCreate condition, which of the job's trainwave
features needs a level above the enforced one, and that the rest comes from
the job's own template: what trainwave adds by itself (the runtime's init
container, its volumes, /dev/shm) passes "restricted" (builders/security.py).

The levels are those of the Pod Security Standards, as pod-security-admission
checks them: "baseline" allows only the capabilities AUDIT_WRITE, CHOWN,
DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID,
SETPCAP, SETUID and SYS_CHROOT, so IPC_LOCK needs "privileged"; host namespaces
and host ports need "privileged" too; "restricted" also wants every container
to run as non-root, with seccomp RuntimeDefault, no privilege escalation and
every capability dropped.
"""

import re

from trainwave.api.network import NetworkSpec

_VIOLATES = re.compile(r'violates PodSecurity "(?P<level>[a-z]+)(:[^"]*)?"')
LEVELS = ("privileged", "baseline", "restricted")  # most to least permissive


def feature_levels(network: NetworkSpec | None) -> list[tuple[str, str, str]]:
    """(feature, what it adds, the most restrictive level that allows it) for the job's
    features that need more than "restricted"."""
    needs: list[tuple[str, str, str]] = []
    if network is not None and network.rdma is not None:
        needs.append(("network.rdma", "the IPC_LOCK capability (RDMA pins memory)", "privileged"))
    if network is not None and network.host_network:
        needs.append(
            ("network.hostNetwork", "the host's network namespace and ports", "privileged")
        )
    return needs


def explain_refusal(message: str, network: NetworkSpec | None) -> str:
    """A sentence for the job's condition, or "" when `message` is no Pod Security refusal."""
    found = _VIOLATES.search(message)
    if found is None:
        return ""
    enforced = found["level"]
    if enforced not in LEVELS:
        return ""
    too_much = [
        (feature, adds, level)
        for feature, adds, level in feature_levels(network)
        if LEVELS.index(level) < LEVELS.index(enforced)
    ]
    if not too_much:
        return (
            f'Pod Security "{enforced}": trainwave adds nothing this level refuses; the '
            "violations come from spec.template (the pod's and the worker container's "
            "securityContext, host settings, volumes)"
        )
    needs = "; ".join(f"{f} adds {adds}, which needs {lvl}" for f, adds, lvl in too_much)
    return (
        f'Pod Security "{enforced}" refuses this job\'s features: {needs}. Run it in a '
        "namespace whose pod-security.kubernetes.io/enforce level allows them, or turn "
        "them off; any other violation comes from spec.template"
    )
