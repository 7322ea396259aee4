// Command pulumi-resource-docker is the LAB STAND-IN docker resource plugin (see README.md).
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"

	"spark-vllm.lab/providers/docker/provider"
	"spark-vllm.lab/providers/docker/version"
)

// schema.json is written by build.sh (pulumi-tfgen-docker) before this package is compiled.
//
//go:embed schema.json
var pulumiSchema []byte

func main() {
	tfbridge.Main("docker", version.Version, provider.Provider(), pulumiSchema)
}
