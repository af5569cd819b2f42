// Command kubelet-harness runs the kubelet's own DRA code outside a kubelet:
// the plugin manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager: socket
// discovery, GetInfo, version negotiation, NotifyRegistrationStatus) and the
// DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra: claim checks against the
// API server, NodePrepareResources/NodeUnprepareResources, checkpointing,
// CDI IDs per container). Only CRI is missing; tests play the container
// runtime with the CDI IDs it returns.
//
// Protocol: one JSON request per line on stdin, one JSON reply per line on
// stdout (see commands.go). klog writes to stderr. The first stdout line is
// {"ready":true,...} once both managers run.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node identity (admin in tests)")
	nodeName := flag.String("node-name", "", "Node this harness plays the kubelet for")
	rootDir := flag.String("root-dir", "", "kubelet root dir; plugins_registry/ below it is watched")
	stateDir := flag.String("state-dir", "", "DRA manager checkpoint dir (default <root-dir>/dra-state)")
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *rootDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-harness: --kubeconfig, --node-name and --root-dir are required")
		os.Exit(2)
	}
	if *stateDir == "" {
		*stateDir = filepath.Join(*rootDir, "dra-state")
	}
	if err := run(*kubeconfig, *nodeName, *rootDir, *stateDir); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-harness: %v\n", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, rootDir, stateDir string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.FromContext(ctx)

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubelet-harness/" + nodeName
	// The kubelet's defaults (KubeletConfiguration kubeAPIQPS/kubeAPIBurst);
	// client-go's own 5/10 would throttle a busy test like no kubelet does.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	registryDir := filepath.Join(rootDir, "plugins_registry")
	for _, d := range []string{registryDir, filepath.Join(rootDir, "plugins"), stateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}

	// Events go to the API server under the kubelet's component name, as the
	// kubelet's recorder does, so tests can read them like a user would.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: nodeName})

	pods := &nodePods{client: client, nodeName: nodeName}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}

	manager, err := dra.NewManager(logger, client, stateDir)
	if err != nil {
		return err
	}
	ready := readyFunc(pods.listedOnce)
	if err := manager.Start(ctx, pods.active, getNode, ready); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	defer manager.Stop()

	handler := newRecordingHandler(manager.GetWatcherHandler())
	plugins := pluginmanager.NewPluginManager(registryDir, recorder)
	plugins.AddHandler("DRAPlugin", handler)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); plugins.Run(ctx, ready, stop) }()
	defer func() { close(stop); wg.Wait() }()

	h := &harness{client: client, manager: manager, handler: handler, recorder: recorder,
		nodeName: nodeName, prepared: map[string]*v1.Pod{}}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"ready": true, "node": nodeName, "registry_dir": registryDir,
		"state_dir": stateDir, "pid": os.Getpid()}); err != nil {
		return err
	}

	lines := make(chan []byte)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1<<20), 1<<20)
		for scanner.Scan() {
			lines <- append([]byte(nil), scanner.Bytes()...)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil // stdin closed: the test is done with us
			}
			reply, quit := h.handle(ctx, line)
			if err := out.Encode(reply); err != nil {
				return err
			}
			if quit {
				return nil
			}
		}
	}
}

// readyFunc adapts a func to config.SourcesReady. The DRA manager's
// reconcile loop only unprepares claims of inactive pods once sources are
// ready, exactly like in the kubelet.
type readyFunc func() bool

var _ config.SourcesReady = readyFunc(nil)

func (readyFunc) AddSource(string) {}
func (f readyFunc) AllReady() bool { return f() }

// nodePods lists the pods bound to the node from the API server. The kubelet
// gets the same set from its pod manager; pods in a terminal phase are not
// active, pods being deleted still are until the harness finalizes them.
type nodePods struct {
	client   kubernetes.Interface
	nodeName string

	mu   sync.Mutex
	last []*v1.Pod
	ok   bool
}

func (p *nodePods) active() []*v1.Pod {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := p.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.nodeName).String(),
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		klog.Background().Error(err, "Listing pods of node failed, reusing last list")
		return p.last
	}
	result := make([]*v1.Pod, 0, len(list.Items))
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		result = append(result, pod)
	}
	p.last, p.ok = result, true
	return result
}

func (p *nodePods) listedOnce() bool {
	p.mu.Lock()
	ok := p.ok
	p.mu.Unlock()
	if !ok {
		p.active()
		p.mu.Lock()
		ok = p.ok
		p.mu.Unlock()
	}
	return ok
}
