package main

import (
	"context"
	"sync"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// registrationEvent is one call the kubelet's plugin manager made into the
// DRA handler. Recording them lets tests see the real registration handshake
// (validate -> register, deregister on socket removal) without scraping logs.
type registrationEvent struct {
	Seq      int      `json:"seq"`
	Kind     string   `json:"kind"` // validate | register | deregister
	Driver   string   `json:"driver"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions,omitempty"`
	Error    string   `json:"error,omitempty"`
	AtUnixMs int64    `json:"at_unix_ms"`
}

// recordingHandler wraps the DRA manager's own PluginHandler. It forwards
// every call unchanged and only notes what happened, so the behaviour under
// test is exactly the kubelet's.
type recordingHandler struct {
	inner cache.PluginHandler

	mu      sync.Mutex
	changed *sync.Cond
	events  []registrationEvent
}

func newRecordingHandler(inner cache.PluginHandler) *recordingHandler {
	h := &recordingHandler{inner: inner}
	h.changed = sync.NewCond(&h.mu)
	return h
}

func (h *recordingHandler) note(kind, driver, endpoint string, versions []string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := registrationEvent{
		Seq: len(h.events) + 1, Kind: kind, Driver: driver, Endpoint: endpoint,
		Versions: versions, AtUnixMs: time.Now().UnixMilli(),
	}
	if err != nil {
		ev.Error = err.Error()
	}
	h.events = append(h.events, ev)
	h.changed.Broadcast()
}

func (h *recordingHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	err := h.inner.ValidatePlugin(ctx, name, endpoint, versions)
	h.note("validate", name, endpoint, versions, err)
	return err
}

func (h *recordingHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.inner.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	h.note("register", name, endpoint, versions, err)
	return err
}

func (h *recordingHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.inner.DeRegisterPlugin(ctx, name, endpoint)
	h.note("deregister", name, endpoint, nil, nil)
}

// snapshot returns a copy of all events so far.
func (h *recordingHandler) snapshot() []registrationEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]registrationEvent(nil), h.events...)
}

// waitRegistered blocks until a successful "register" event for driver with
// a sequence number above afterSeq exists, or the timeout passes.
func (h *recordingHandler) waitRegistered(driver string, afterSeq int, timeout time.Duration) (registrationEvent, bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		h.mu.Lock()
		h.changed.Broadcast()
		h.mu.Unlock()
	})
	defer timer.Stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		for _, ev := range h.events {
			if ev.Seq > afterSeq && ev.Kind == "register" && ev.Driver == driver && ev.Error == "" {
				return ev, true
			}
		}
		if !time.Now().Before(deadline) {
			return registrationEvent{}, false
		}
		h.changed.Wait()
	}
}
