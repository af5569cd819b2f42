// celoracle evaluates DRA CEL selectors exactly as the kube-scheduler does, with
// k8s.io/dynamic-resource-allocation/cel (the scheduler's own code), so the Python
// CEL layer's conformance corpus is checked against Kubernetes itself.
//
// Protocol: one JSON object per stdin line, {"expression", "driver", "device":
// {"attributes", "capacity", "allowMultipleAllocations"}} in resource.k8s.io/v1
// JSON; one JSON answer per line: {"result": bool} or {"compileError": msg} or
// {"runtimeError": msg}, plus "cost" (the estimated maximum cost) when it compiled.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

type deviceJSON struct {
	Attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity  `json:"capacity"`
	AllowMultipleAllocations *bool                                                     `json:"allowMultipleAllocations"`
}

type request struct {
	Expression string     `json:"expression"`
	Driver     string     `json:"driver"`
	Device     deviceJSON `json:"device"`
}

type answer struct {
	Result       *bool   `json:"result,omitempty"`
	CompileError string  `json:"compileError,omitempty"`
	RuntimeError string  `json:"runtimeError,omitempty"`
	Cost         *uint64 `json:"cost,omitempty"`
}

func main() {
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "celoracle: bad request: %v\n", err)
			os.Exit(2)
		}
		var ans answer
		compiled := compiler.CompileCELExpression(req.Expression, dracel.Options{})
		if compiled.Error != nil {
			ans.CompileError = compiled.Error.Error()
		} else {
			cost := compiled.MaxCost
			ans.Cost = &cost
			matches, _, err := compiled.DeviceMatches(context.Background(), dracel.Device{
				Driver:                   req.Driver,
				AllowMultipleAllocations: req.Device.AllowMultipleAllocations,
				Attributes:               req.Device.Attributes,
				Capacity:                 req.Device.Capacity,
			})
			if err != nil {
				ans.RuntimeError = err.Error()
			} else {
				ans.Result = &matches
			}
		}
		if err := out.Encode(ans); err != nil {
			fmt.Fprintf(os.Stderr, "celoracle: %v\n", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "celoracle: %v\n", err)
		os.Exit(1)
	}
}
