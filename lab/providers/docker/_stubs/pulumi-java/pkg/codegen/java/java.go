// Package java is a lab stub of github.com/pulumi/pulumi-java/pkg/codegen/java.
//
// The Go module proxy refuses that module at every version. The bridge's tfgen imports it only to
// translate Terraform examples into Java for the docs, and this lab build never does that.
// GenerateProgram always fails, so a caller sees an error instead of empty output.
package java

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/pulumi/pulumi/pkg/v3/codegen/pcl"
)

// GenerateProgram is not available in the lab build.
func GenerateProgram(_ *pcl.Program) (map[string][]byte, hcl.Diagnostics, error) {
	return nil, nil, fmt.Errorf("%s program generation is not available in the spark-vllm lab build (stubbed github.com/pulumi/pulumi-java/pkg/codegen/java)", "Java")
}
