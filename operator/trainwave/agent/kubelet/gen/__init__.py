"""Generated gRPC stubs of the kubelet's plugin APIs (hack/protos.py, `make generate`).

pluginregistration_v1: k8s.io/kubelet pkg/apis/pluginregistration/v1 (GetInfo,
NotifyRegistrationStatus). dra_v1: pkg/apis/dra/v1 (NodePrepareResources,
NodeUnprepareResources). Only this file is written by hand.
"""
