// verdicts: what Flux and Argo CD conclude about objects, judged by their own code.
//
//	verdicts --lua-dir deploy/argocd/health --exprs deploy/flux/health-check-exprs.yaml <objects.json
//
// stdin: a JSON array of objects as the API server returns them. stdout: a JSON array, one entry
// per object: kstatus (Flux's fork, status.Compute: what `wait: true` concludes without
// healthCheckExprs), cel (the fluxcd/pkg/runtime/cel status reader kustomize-controller builds
// from healthCheckExprs) and argocd (the kind's health script in gopher-lua, libraries opened as
// Argo CD's util/lua/lua.go runLua opens them).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling/engine"
	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Verdict is one judge's conclusion; Error is set when the judge itself failed (a Lua error is
// Argo CD's Unknown, a CEL error the status reader's Unknown).
type Verdict struct {
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Judged is every judge's verdict on one object.
type Judged struct {
	Kind    string  `json:"kind"`
	Name    string  `json:"name"`
	KStatus Verdict `json:"kstatus"`
	CEL     Verdict `json:"cel"`
	ArgoCD  Verdict `json:"argocd"`
}

// exprsFile is deploy/flux/health-check-exprs.yaml: the healthCheckExprs of a Kustomization.
type exprsFile struct {
	HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
}

func main() {
	luaDir := flag.String("lua-dir", "", "directory of <Kind>.lua Argo CD health scripts")
	exprs := flag.String("exprs", "", "YAML file with healthCheckExprs")
	flag.Parse()
	if err := run(*luaDir, *exprs, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "verdicts:", err)
		os.Exit(1)
	}
}

func run(luaDir, exprsPath string, in io.Reader, out io.Writer) error {
	raw, err := os.ReadFile(exprsPath)
	if err != nil {
		return err
	}
	var ef exprsFile
	if err := yaml.UnmarshalStrict(raw, &ef); err != nil {
		return fmt.Errorf("%s: %w", exprsPath, err)
	}
	reader, err := cel.NewStatusReader(ef.HealthCheckExprs)
	if err != nil {
		return fmt.Errorf("%s: %w", exprsPath, err)
	}
	celReader := reader(nil)
	body, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var objects []json.RawMessage
	if err := json.Unmarshal(body, &objects); err != nil {
		return fmt.Errorf("stdin: %w", err)
	}
	judged := make([]Judged, 0, len(objects))
	for i, o := range objects {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(o); err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		script, err := os.ReadFile(filepath.Join(luaDir, u.GetKind()+".lua"))
		if err != nil {
			return err
		}
		judged = append(judged, Judged{
			Kind:    u.GetKind(),
			Name:    u.GetName(),
			KStatus: kstatusVerdict(u),
			CEL:     celVerdict(celReader, u),
			ArgoCD:  argoVerdict(u, string(script)),
		})
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(judged)
}

func kstatusVerdict(u *unstructured.Unstructured) Verdict {
	res, err := status.Compute(u.DeepCopy())
	if err != nil {
		return Verdict{Status: string(status.UnknownStatus), Error: err.Error()}
	}
	return Verdict{Status: string(res.Status), Message: res.Message}
}

// celVerdict: the status reader kustomize-controller installs for the kinds that have
// healthCheckExprs (its generic reader turns an evaluation error into Unknown).
func celVerdict(r engine.StatusReader, u *unstructured.Unstructured) Verdict {
	if !r.Supports(u.GroupVersionKind().GroupKind()) {
		return Verdict{Status: string(status.UnknownStatus), Error: "no healthCheckExprs for " + u.GetKind()}
	}
	rs, err := r.ReadStatusForObject(context.Background(), nil, u.DeepCopy())
	if err != nil {
		return Verdict{Status: string(status.UnknownStatus), Error: err.Error()}
	}
	v := Verdict{Status: string(rs.Status), Message: rs.Message}
	if rs.Error != nil {
		v.Error = rs.Error.Error()
	}
	return v
}
