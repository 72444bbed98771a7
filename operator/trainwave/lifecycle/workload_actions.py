"""What a decision asks of a queued job's Kueue Workload (lifecycle/admission.py says when).

Pure; its own module so draft.py can carry it without importing admission.py.
"""

from enum import StrEnum


class WorkloadAction(StrEnum):
    NONE = ""
    CREATE = "Create"
    RELEASE = "Release"  # give back the quota of an evicted Workload
    FINISH = "Finish"  # Finished=True: the job ended, the quota is free
    DEACTIVATE = "Deactivate"  # spec.active false: the job is suspended, Kueue evicts it
    ACTIVATE = "Activate"  # spec.active true again: the job resumed, Kueue queues it
