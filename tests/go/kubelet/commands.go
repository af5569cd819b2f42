package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// failedPrepareReason is the event reason the kubelet's runtime manager uses
// when PrepareResources fails (pkg/kubelet/events.FailedPrepareDynamicResources).
const failedPrepareReason = "FailedPrepareDynamicResources"

// request is one line on stdin.
//
//	{"op":"ping"}
//	{"op":"registrations"}                                   -> all plugin manager calls so far
//	{"op":"wait_registered","driver":D,"after_seq":N,"timeout_s":T}
//	{"op":"prepare","namespace":NS,"pod":P}                 -> CDI IDs per container
//	{"op":"unprepare","namespace":NS,"pod":P,"finalize":true}
//	{"op":"set_running","namespace":NS,"pod":P}              -> pod status Running with device health, like the status manager
//	{"op":"prepared"}                                        -> pods prepared here and not unprepared
//	{"op":"shutdown"}
type request struct {
	ID        any     `json:"id,omitempty"`
	Op        string  `json:"op"`
	Namespace string  `json:"namespace,omitempty"`
	Pod       string  `json:"pod,omitempty"`
	Driver    string  `json:"driver,omitempty"`
	AfterSeq  int     `json:"after_seq,omitempty"`
	TimeoutS  float64 `json:"timeout_s,omitempty"`
	Finalize  *bool   `json:"finalize,omitempty"`
}

type deviceInfo struct {
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	RequestNames []string `json:"request_names"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
}

type claimInfo struct {
	Name    string       `json:"name"`
	UID     string       `json:"uid"`
	PodUIDs []string     `json:"pod_uids"`
	Devices []deviceInfo `json:"devices"`
}

type containerInfo struct {
	CDIDevices []string    `json:"cdi_devices"`
	Claims     []claimInfo `json:"claims"`
}

type harness struct {
	client   kubernetes.Interface
	manager  *dra.Manager
	handler  *recordingHandler
	recorder record.EventRecorder
	nodeName string

	mu       sync.Mutex
	prepared map[string]*v1.Pod // namespace/name -> pod as last prepared
}

func (h *harness) handle(ctx context.Context, line []byte) (map[string]any, bool) {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return map[string]any{"ok": false, "error": fmt.Sprintf("bad request JSON: %v", err)}, false
	}
	start := time.Now()
	reply, quit := h.dispatch(ctx, &req)
	if reply == nil {
		reply = map[string]any{}
	}
	if _, set := reply["ok"]; !set {
		reply["ok"] = true
	}
	reply["id"] = req.ID
	reply["op"] = req.Op
	reply["elapsed_ms"] = float64(time.Since(start).Microseconds()) / 1000
	return reply, quit
}

func fail(err error) map[string]any { return map[string]any{"ok": false, "error": err.Error()} }

func (h *harness) dispatch(ctx context.Context, req *request) (map[string]any, bool) {
	switch req.Op {
	case "ping":
		return nil, false
	case "shutdown":
		return nil, true
	case "registrations":
		return map[string]any{"events": h.handler.snapshot()}, false
	case "wait_registered":
		timeout := time.Duration(req.TimeoutS * float64(time.Second))
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		ev, ok := h.handler.waitRegistered(req.Driver, req.AfterSeq, timeout)
		if !ok {
			return map[string]any{"ok": false, "error": fmt.Sprintf("driver %q did not register within %s", req.Driver, timeout),
				"events": h.handler.snapshot()}, false
		}
		return map[string]any{"event": ev}, false
	case "prepare":
		return h.prepare(ctx, req), false
	case "unprepare":
		return h.unprepare(ctx, req), false
	case "set_running":
		return h.setRunning(ctx, req), false
	case "prepared":
		h.mu.Lock()
		defer h.mu.Unlock()
		pods := make([]string, 0, len(h.prepared))
		for key := range h.prepared {
			pods = append(pods, key)
		}
		sort.Strings(pods)
		return map[string]any{"pods": pods}, false
	default:
		return map[string]any{"ok": false, "error": fmt.Sprintf("unknown op %q (allowed: ping, registrations, "+
			"wait_registered, prepare, unprepare, set_running, prepared, shutdown)", req.Op)}, false
	}
}

// prepare does what the kubelet does before creating a pod's sandbox:
// PrepareResources (ownership and reservedFor checks against the API server,
// one NodePrepareResources call per driver, checkpoint), then GetResources per
// container for the CDI IDs that CRI would carry. A failure is reported as a
// Warning event on the pod with the kubelet's reason and message format.
func (h *harness) prepare(ctx context.Context, req *request) map[string]any {
	pod, err := h.client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
	if err != nil {
		return fail(fmt.Errorf("get pod %s/%s: %w", req.Namespace, req.Pod, err))
	}
	if pod.Spec.NodeName != h.nodeName {
		return fail(fmt.Errorf("pod %s/%s is bound to %q, not to node %q", req.Namespace, req.Pod, pod.Spec.NodeName, h.nodeName))
	}
	if err := h.manager.PrepareResources(ctx, pod); err != nil {
		h.recorder.Eventf(pod, v1.EventTypeWarning, failedPrepareReason, "Failed to prepare dynamic resources: %v", err)
		reply := fail(err)
		reply["pod_uid"] = string(pod.UID)
		return reply
	}
	h.mu.Lock()
	h.prepared[req.Namespace+"/"+req.Pod] = pod
	h.mu.Unlock()

	containers := map[string]containerInfo{}
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		c := &all[i]
		info, err := h.manager.GetResources(pod, c)
		if err != nil {
			return fail(fmt.Errorf("container %s: %w", c.Name, err))
		}
		ci := containerInfo{CDIDevices: []string{}, Claims: []claimInfo{}}
		for _, d := range info.CDIDevices {
			ci.CDIDevices = append(ci.CDIDevices, d.Name)
		}
		infos, err := h.manager.GetContainerClaimInfos(pod, c)
		if err != nil {
			return fail(fmt.Errorf("container %s: %w", c.Name, err))
		}
		for _, in := range infos {
			cl := claimInfo{Name: in.ClaimName, UID: string(in.ClaimUID), PodUIDs: in.PodUIDs.UnsortedList(), Devices: []deviceInfo{}}
			for driver, st := range in.DriverState {
				for _, d := range st.Devices {
					cl.Devices = append(cl.Devices, deviceInfo{Driver: driver, Pool: d.PoolName, Device: d.DeviceName,
						RequestNames: d.RequestNames, CDIDeviceIDs: d.CDIDeviceIDs})
				}
			}
			ci.Claims = append(ci.Claims, cl)
		}
		containers[c.Name] = ci
	}
	return map[string]any{"pod_uid": string(pod.UID), "containers": containers}
}

// unprepare does what the kubelet does once a pod's containers are gone:
// UnprepareResources (NodeUnprepareResources only when the last pod using a
// claim goes), then, for a pod being deleted, the status manager's final
// delete with grace period 0 so the controllers see the pod gone.
func (h *harness) unprepare(ctx context.Context, req *request) map[string]any {
	key := req.Namespace + "/" + req.Pod
	pod, err := h.client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fail(fmt.Errorf("get pod %s: %w", key, err))
	}
	if !exists {
		h.mu.Lock()
		pod = h.prepared[key]
		h.mu.Unlock()
		if pod == nil {
			return fail(fmt.Errorf("pod %s is gone and was never prepared here", key))
		}
	}
	if err := h.manager.UnprepareResources(ctx, pod); err != nil {
		return fail(err)
	}
	h.mu.Lock()
	delete(h.prepared, key)
	h.mu.Unlock()
	finalized := false
	if exists && pod.DeletionTimestamp != nil && (req.Finalize == nil || *req.Finalize) {
		zero := int64(0)
		err := h.client.CoreV1().Pods(req.Namespace).Delete(ctx, req.Pod, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			return fail(fmt.Errorf("final delete of pod %s: %w", key, err))
		}
		finalized = true
	}
	return map[string]any{"pod_uid": string(pod.UID), "finalized": finalized}
}

// setRunning writes the status a kubelet reports once the containers run,
// so controllers and users see the pod Running.
func (h *harness) setRunning(ctx context.Context, req *request) map[string]any {
	pod, err := h.client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
	if err != nil {
		return fail(err)
	}
	now := metav1.Now()
	pod.Status.Phase = v1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []v1.PodCondition{
		{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	// Device health from the plugins' health streams, as the kubelet's status
	// manager adds it (ResourceHealthStatus).
	h.manager.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), pod, &pod.Status)
	updated, err := h.client.CoreV1().Pods(req.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		return fail(err)
	}
	health := map[string]any{}
	for _, cs := range updated.Status.ContainerStatuses {
		health[cs.Name] = cs.AllocatedResourcesStatus
	}
	return map[string]any{"allocated_resources_status": health}
}
