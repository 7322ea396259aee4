// Package shim is copied by build.sh into the writable copy of the upstream Terraform provider
// (kreuzwerker/terraform-provider-docker, module path github.com/terraform-providers/terraform-provider-docker).
// It has to live inside that module: the provider is in an internal/ package, which only code
// of the same module may import. It does what pulumi-docker's upstream patch 0001 does.
package shim

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/terraform-providers/terraform-provider-docker/internal/provider"
)

// NewProvider returns the upstream's SDKv2 provider (not the plugin-framework half of its mux).
func NewProvider() *schema.Provider {
	return provider.New("dev")()
}
