"""The doctor: a GPUDirect RDMA checklist run inside the worker before training.

Each check reads from a root path and an environment (see `host.Host`), so
tests run them on fake sysfs/procfs trees. Each returns PASS, WARN, FAIL or
SKIP with a reason; the report's verdict is the worst of them.
"""

from trainwave.runtime.doctor.checklist import CHECKS, run_doctor
from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.report import Check, DoctorReport, Status

__all__ = ["CHECKS", "Check", "DoctorReport", "Host", "Status", "run_doctor"]
