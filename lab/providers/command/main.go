// pulumi-resource-command: a LAB STAND-IN for pulumi-command 1.2.1, written for spark-vllm
// on pulumi-go-provider. It is not Pulumi's released binary; see README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"

	"spark-vllm/lab/command/provider"
)

func main() {
	prov, err := provider.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
	if err := p.RunProvider(context.Background(), provider.Name, strings.TrimPrefix(provider.Version, "v"), prov); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
}
