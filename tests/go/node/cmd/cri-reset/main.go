// Command cri-reset stops and removes every pod sandbox a CRI runtime holds
// (and with them their containers), for the real-node tier's teardown. It does
// what `crictl rmp --force --all` does; cri-tools is not a Go module the
// proxy serves, so this small client over k8s.io/cri-api stands in.
//
//	cri-reset unix:///path/to/containerd.sock
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cri-reset unix:///path/to/runtime.sock")
		os.Exit(2)
	}
	if err := reset(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "cri-reset:", err)
		os.Exit(1)
	}
}

func reset(endpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect %s: %w", endpoint, err)
	}
	defer conn.Close()
	client := runtime.NewRuntimeServiceClient(conn)
	listed, err := client.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	var failures int
	for _, sandbox := range listed.Items {
		name := sandbox.Metadata.Namespace + "/" + sandbox.Metadata.Name
		if _, err := client.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "stop sandbox %s: %v\n", name, err)
			failures++
			continue
		}
		if _, err := client.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "remove sandbox %s: %v\n", name, err)
			failures++
			continue
		}
		fmt.Printf("removed sandbox %s\n", name)
	}
	if failures > 0 {
		return fmt.Errorf("%d of %d sandboxes not removed", failures, len(listed.Items))
	}
	return nil
}
