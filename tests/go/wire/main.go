// Command wire plays the kubelet's side of the DRA plugin wire protocol using
// the official generated clients from k8s.io/kubelet, to prove that our own
// .proto files are wire-compatible with what a real kubelet sends.
//
// Steps, as the kubelet's plugin manager and DRA manager do them:
//  1. find the registration socket in -registry-dir (names starting with "."
//     are ignored), dial it and call GetInfo with a 1 s deadline;
//  2. walk the plugin's supported_versions in order and take the first
//     node-service version this harness knows (kubelet >= 1.34 rule);
//  3. NotifyRegistrationStatus(true) with a 5 s deadline;
//  4. dial the endpoint and call NodePrepareResources and then
//     NodeUnprepareResources for -claims with a 45 s deadline each;
//  5. if a health version was advertised, read the first NodeWatchResources
//     message.
//
// The result is printed as one JSON object on stdout for the pytest driver.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type claimRef struct{ Namespace, Name, UID string }

type device struct {
	RequestNames []string `json:"request_names"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      *string  `json:"share_id,omitempty"`
}

type prepared struct {
	Devices []device `json:"devices"`
	Error   string   `json:"error"`
}

type healthEntry struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Timeout int64  `json:"timeout_s"`
}

type result struct {
	RegistrationSocket string              `json:"registration_socket"`
	GetInfoMillis      int64               `json:"get_info_ms"`
	Type               string              `json:"type"`
	Name               string              `json:"name"`
	Endpoint           string              `json:"endpoint"`
	SupportedVersions  []string            `json:"supported_versions"`
	ChosenVersion      string              `json:"chosen_version"`
	HealthVersion      string              `json:"health_version"`
	Prepare            map[string]prepared `json:"prepare"`
	Unprepare          map[string]string   `json:"unprepare"`
	Health             []healthEntry       `json:"health"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "wire: "+format+"\n", args...)
	os.Exit(1)
}

func findSocket(dir string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") && e.Type()&os.ModeSocket != 0 {
				return filepath.Join(dir, e.Name())
			}
		}
		if time.Now().After(deadline) {
			fail("no registration socket in %s after %s", dir, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dial(path string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("dial %s: %v", path, err)
	}
	return conn
}

func parseClaims(spec string) []claimRef {
	var out []claimRef
	for _, item := range strings.Split(spec, ",") {
		if item == "" {
			continue
		}
		parts := strings.Split(item, "/")
		if len(parts) != 3 {
			fail("claim %q: want namespace/name/uid", item)
		}
		out = append(out, claimRef{parts[0], parts[1], parts[2]})
	}
	return out
}

func main() {
	registryDir := flag.String("registry-dir", "", "kubelet plugins_registry directory to watch")
	claimsFlag := flag.String("claims", "", "comma-separated namespace/name/uid claims to prepare")
	forceVersion := flag.String("version", "", "use this node-service version instead of negotiating")
	forceHealth := flag.String("health-version", "", "use this health version instead of negotiating")
	flag.Parse()
	if *registryDir == "" {
		fail("-registry-dir is required")
	}
	res := result{Prepare: map[string]prepared{}, Unprepare: map[string]string{}}
	res.RegistrationSocket = findSocket(*registryDir, 10*time.Second)

	regConn := dial(res.RegistrationSocket)
	defer regConn.Close()
	reg := registerapi.NewRegistrationClient(regConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	start := time.Now()
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	cancel()
	if err != nil {
		fail("GetInfo: %v", err)
	}
	res.GetInfoMillis = time.Since(start).Milliseconds()
	res.Type, res.Name, res.Endpoint = info.Type, info.Name, info.Endpoint
	res.SupportedVersions = info.SupportedVersions

	known := map[string]bool{drav1.DRAPluginService: true, drav1beta1.DRAPluginService: true}
	for _, v := range info.SupportedVersions {
		if res.ChosenVersion == "" && known[v] {
			res.ChosenVersion = v
		}
		if res.HealthVersion == "" && (v == drahealthv1.DRAResourceHealthService || v == drahealthv1alpha1.DRAResourceHealthService) {
			res.HealthVersion = v
		}
	}
	if *forceVersion != "" {
		res.ChosenVersion = *forceVersion
	}
	if *forceHealth != "" {
		res.HealthVersion = *forceHealth
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: res.Type == registerapi.DRAPlugin && res.ChosenVersion != ""}
	if !status.PluginRegistered {
		status.Error = "no supported DRA version or wrong plugin type"
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := reg.NotifyRegistrationStatus(ctx, status); err != nil {
		fail("NotifyRegistrationStatus: %v", err)
	}
	cancel()
	if !status.PluginRegistered {
		fail("%s", status.Error)
	}

	conn := dial(info.Endpoint)
	defer conn.Close()
	claims := parseClaims(*claimsFlag)
	switch res.ChosenVersion {
	case drav1.DRAPluginService:
		callV1(conn, claims, &res)
	case drav1beta1.DRAPluginService:
		callV1beta1(conn, claims, &res)
	default:
		fail("unknown version %q", res.ChosenVersion)
	}
	if res.HealthVersion != "" {
		readHealth(conn, &res)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail("encode: %v", err)
	}
}

func callV1(conn *grpc.ClientConn, claims []claimRef, res *result) {
	client := drav1.NewDRAPluginClient(conn)
	var req []*drav1.Claim
	for _, c := range claims {
		req = append(req, &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	resp, err := client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: req})
	if err != nil {
		fail("NodePrepareResources v1: %v", err)
	}
	for uid, r := range resp.Claims {
		p := prepared{Error: r.Error, Devices: []device{}}
		for _, d := range r.Devices {
			p.Devices = append(p.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, d.ShareId})
		}
		res.Prepare[uid] = p
	}
	un, err := client.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: req})
	if err != nil {
		fail("NodeUnprepareResources v1: %v", err)
	}
	for uid, r := range un.Claims {
		res.Unprepare[uid] = r.Error
	}
}

func callV1beta1(conn *grpc.ClientConn, claims []claimRef, res *result) {
	client := drav1beta1.NewDRAPluginClient(conn)
	var req []*drav1beta1.Claim
	for _, c := range claims {
		req = append(req, &drav1beta1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	resp, err := client.NodePrepareResources(ctx, &drav1beta1.NodePrepareResourcesRequest{Claims: req})
	if err != nil {
		fail("NodePrepareResources v1beta1: %v", err)
	}
	for uid, r := range resp.Claims {
		p := prepared{Error: r.Error, Devices: []device{}}
		for _, d := range r.Devices {
			p.Devices = append(p.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, nil})
		}
		res.Prepare[uid] = p
	}
	un, err := client.NodeUnprepareResources(ctx, &drav1beta1.NodeUnprepareResourcesRequest{Claims: req})
	if err != nil {
		fail("NodeUnprepareResources v1beta1: %v", err)
	}
	for uid, r := range un.Claims {
		res.Unprepare[uid] = r.Error
	}
}

func readHealth(conn *grpc.ClientConn, res *result) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch res.HealthVersion {
	case drahealthv1.DRAResourceHealthService:
		stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
		if err != nil {
			fail("NodeWatchResources v1: %v", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			fail("NodeWatchResources v1 recv: %v", err)
		}
		for _, d := range msg.Devices {
			res.Health = append(res.Health, healthEntry{d.Device.PoolName, d.Device.DeviceName, d.Health.String(), d.HealthCheckTimeoutSeconds})
		}
	case drahealthv1alpha1.DRAResourceHealthService:
		stream, err := drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err != nil {
			fail("NodeWatchResources v1alpha1: %v", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			fail("NodeWatchResources v1alpha1 recv: %v", err)
		}
		for _, d := range msg.Devices {
			res.Health = append(res.Health, healthEntry{d.Device.PoolName, d.Device.DeviceName, d.Health.String(), d.HealthCheckTimeoutSeconds})
		}
	}
}
