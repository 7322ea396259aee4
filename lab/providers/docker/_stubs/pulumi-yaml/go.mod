// Lab stub, see ../README.md: the Go module proxy refuses github.com/pulumi/pulumi-yaml at every version.
module github.com/pulumi/pulumi-yaml

go 1.25.9

require (
	github.com/hashicorp/hcl/v2 v2.24.0
	github.com/pulumi/pulumi/pkg/v3 v3.246.0
)
