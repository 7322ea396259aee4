// Package provider assembles the LAB STAND-IN command provider: the resources it serves
// and the one behaviour infer's default diff lacks (triggers replace at any depth).
package provider

import (
	"context"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/infer"

	"spark-vllm/lab/command/local"
	"spark-vllm/lab/command/remote"
)

// Name is the package name the SDK asks for.
const Name = "command"

// Version is set at build time (-ldflags "-X spark-vllm/lab/command/provider.Version=1.2.1").
var Version = "0.0.0-lab-dev"

// New returns the provider.
func New() (p.Provider, error) {
	prov, err := infer.NewProviderBuilder().
		WithDisplayName("Command (spark-vllm lab stand-in)").
		WithDescription("LAB STAND-IN written for spark-vllm on pulumi-go-provider: the subset of "+
			"pulumi-command 1.2.1 that spark-vllm uses. Not Pulumi's released binary.").
		WithKeywords("pulumi", "command", "lab-stand-in").
		WithLicense("Apache-2.0").
		WithResources(
			infer.Resource(&local.Command{}),
			infer.Resource(&remote.Command{}),
		).
		Build()
	if err != nil {
		return p.Provider{}, err
	}
	inner := prov.Diff
	prov.Diff = func(ctx context.Context, req p.DiffRequest) (p.DiffResponse, error) {
		resp, err := inner(ctx, req)
		if err != nil {
			return resp, err
		}
		return ReplaceOnTriggers(resp), nil
	}
	return prov, nil
}

// ReplaceOnTriggers turns any change under `triggers` (triggers, triggers[0], ...) into
// a replacement. infer only forces replaces for whole top-level keys, and an element
// change is reported as "triggers[0]".
func ReplaceOnTriggers(resp p.DiffResponse) p.DiffResponse {
	for k, d := range resp.DetailedDiff {
		if k != "triggers" && !strings.HasPrefix(k, "triggers[") && !strings.HasPrefix(k, "triggers.") {
			continue
		}
		switch d.Kind {
		case p.Add:
			d.Kind = p.AddReplace
		case p.Delete:
			d.Kind = p.DeleteReplace
		case p.Update:
			d.Kind = p.UpdateReplace
		}
		resp.DetailedDiff[k] = d
	}
	return resp
}
