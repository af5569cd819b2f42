// Command cdi-harness does with our CDI specs what containerd does before it
// starts a container: configure the CDI registry with the spec directories,
// refresh it, resolve the requested qualified device names and inject their
// edits into an OCI runtime spec. It writes the edited spec as config.json so
// a test can run it with runc.
//
// Unlike containerd, which only logs refresh errors, the harness fails when any
// spec file in the given directories is invalid: our specs must load cleanly.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

type dirList []string

func (d *dirList) String() string     { return strings.Join(*d, ",") }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

func main() {
	var dirs dirList
	flag.Var(&dirs, "spec-dir", "CDI spec directory (repeatable, later = higher priority)")
	base := flag.String("base", "", "OCI runtime spec to edit (JSON)")
	out := flag.String("out", "", "where to write the edited OCI spec")
	list := flag.Bool("list", false, "print the qualified names of all loaded devices and exit")
	flag.Parse()
	if err := run(dirs, *base, *out, *list, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cdi-harness:", err)
		os.Exit(1)
	}
}

func run(dirs []string, base, out string, list bool, ids []string) error {
	if len(dirs) == 0 {
		return fmt.Errorf("at least one -spec-dir is required")
	}
	if err := cdi.Configure(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false)); err != nil {
		return fmt.Errorf("configure: %w", err)
	}
	refreshErr := cdi.Refresh()
	cache := cdi.GetDefaultCache()
	if errs := cache.GetErrors(); len(errs) > 0 {
		paths := make([]string, 0, len(errs))
		for p := range errs {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		var b strings.Builder
		for _, p := range paths {
			for _, e := range errs[p] {
				fmt.Fprintf(&b, "\n  %s: %v", p, e)
			}
		}
		return fmt.Errorf("spec errors:%s", b.String())
	}
	if refreshErr != nil {
		return fmt.Errorf("refresh: %w", refreshErr)
	}
	if list {
		names := cache.ListDevices()
		sort.Strings(names)
		for _, n := range names {
			fmt.Println(n)
		}
		return nil
	}
	for _, id := range ids {
		if _, _, _, err := parser.ParseQualifiedName(id); err != nil {
			return fmt.Errorf("device %q: %w", id, err)
		}
	}
	raw, err := os.ReadFile(base)
	if err != nil {
		return fmt.Errorf("read base spec: %w", err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("parse base spec %s: %w", base, err)
	}
	unresolved, err := cdi.InjectDevices(&spec, ids...)
	if err != nil {
		return fmt.Errorf("inject (unresolved %v): %w", unresolved, err)
	}
	edited, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, edited, 0o644)
}
