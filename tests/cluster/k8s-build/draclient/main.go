// draclient plays the kubelet against a DRA kubelet plugin, with the kubelet's own
// generated gRPC clients (k8s.io/kubelet v0.34.4): GetInfo and NotifyRegistrationStatus
// on the registration socket, then NodePrepareResources and NodeUnprepareResources for
// one claim on the endpoint GetInfo names. It prints the answers as JSON, so tests check
// trainwave's hand-encoded protobuf against the upstream encoding.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func dial(path string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("dial %s: %v", path, err)
	}
	return conn
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "draclient: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	registration := flag.String("registration", "", "the plugin's registration socket")
	namespace := flag.String("namespace", "", "the claim's namespace")
	name := flag.String("name", "", "the claim's name")
	uid := flag.String("uid", "", "the claim's UID")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	registry := registerapi.NewRegistrationClient(dial(*registration))
	info, err := registry.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		fail("GetInfo: %v", err)
	}
	if _, err := registry.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		fail("NotifyRegistrationStatus: %v", err)
	}
	plugin := drapb.NewDRAPluginClient(dial(info.Endpoint))
	claims := []*drapb.Claim{{Namespace: *namespace, UID: *uid, Name: *name}}
	prepared, err := plugin.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		fail("NodePrepareResources: %v", err)
	}
	unprepared, err := plugin.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	if err != nil {
		fail("NodeUnprepareResources: %v", err)
	}
	out := map[string]any{"info": info, "prepared": prepared, "unprepared": unprepared}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}
