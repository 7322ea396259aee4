// Package provider maps the kreuzwerker Terraform docker provider onto the Pulumi tokens and
// property names that the pulumi_docker 5.1.0 SDK sends. Every name here is checked against the
// SDK by check_mapping.py (run by build.sh); see README.md.
package provider

import (
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/terraform-providers/terraform-provider-docker/shim"

	"spark-vllm.lab/providers/docker/version"
)

const mainMod = "index"

func resource(name string) tfbridge.ResourceInfo {
	return tfbridge.ResourceInfo{Tok: tfbridge.MakeResource("docker", mainMod, name)}
}

// Provider returns the bridge description of the lab docker provider.
func Provider() tfbridge.ProviderInfo {
	// Panics early with a clear message when built without the version ldflag.
	_ = tfbridge.GetModuleMajorVersion(version.Version)

	container := resource("Container")
	// The container name is unique per daemon: the old container must go before the new one starts.
	container.DeleteBeforeReplace = true
	container.Fields = map[string]*tfbridge.SchemaInfo{
		// A list, but one command: the SDK sends "command", not "commands".
		"command": {Name: "command"},
		// Not pluralised in the SDK either.
		"networks_advanced": {Name: "networksAdvanced"},
	}

	image := resource("RemoteImage")
	image.Fields = map[string]*tfbridge.SchemaInfo{
		// The image reference, not a resource name: keep it out of SetAutonaming.
		"name": {Name: "name"},
	}

	// The rest is mapped too, because tfgen refuses unmapped TF resources. The names are checked the same way
	// (check_mapping.py), but only the resources above are exercised against a daemon.
	other := map[string]string{
		"docker_network":        "Network",
		"docker_volume":         "Volume",
		"docker_config":         "ServiceConfig",
		"docker_secret":         "Secret",
		"docker_service":        "Service",
		"docker_plugin":         "Plugin",
		"docker_registry_image": "RegistryImage",
		"docker_tag":            "Tag",
		"docker_buildx_builder": "BuildxBuilder",
	}

	prov := tfbridge.ProviderInfo{
		P:           shimv2.NewProvider(shim.NewProvider()),
		Name:        "docker",
		Version:     version.Version,
		DisplayName: "Docker (lab stand-in)",
		Description: "LAB STAND-IN for pulumi-resource-docker 5.1.0, bridged from kreuzwerker/terraform-provider-docker. Not Pulumi's released binary.",
		Keywords:    []string{"pulumi", "docker"},
		License:     "Apache-2.0",
		Homepage:    "https://www.pulumi.com",
		Repository:  "https://github.com/pulumi/pulumi-docker",
		Config: map[string]*tfbridge.SchemaInfo{
			"host": {
				Default: &tfbridge.DefaultInfo{
					Value:   "unix:///var/run/docker.sock",
					EnvVars: []string{"DOCKER_HOST"},
				},
			},
			// A list of blocks, but the SDK calls it "registryAuth" (singular, and a list).
			"registry_auth": {
				Name:        "registryAuth",
				MaxItemsOne: tfbridge.False(),
			},
		},
		Resources: map[string]*tfbridge.ResourceInfo{
			"docker_container": &container,
			"docker_image":     &image,
		},
		DataSources: map[string]*tfbridge.DataSourceInfo{
			"docker_registry_image":           {Tok: tfbridge.MakeDataSource("docker", mainMod, "getRegistryImage")},
			"docker_registry_image_manifests": {Tok: tfbridge.MakeDataSource("docker", mainMod, "getRegistryImageManifests")},
			"docker_network":                  {Tok: tfbridge.MakeDataSource("docker", mainMod, "getNetwork")},
			"docker_plugin":                   {Tok: tfbridge.MakeDataSource("docker", mainMod, "getPlugin")},
			"docker_image":                    {Tok: tfbridge.MakeDataSource("docker", mainMod, "getRemoteImage")},
			"docker_logs":                     {Tok: tfbridge.MakeDataSource("docker", mainMod, "getLogs")},
		},
		Python: &tfbridge.PythonInfo{},
	}
	for tf, name := range other {
		r := resource(name)
		prov.Resources[tf] = &r
	}
	prov.SetAutonaming(255, "-")
	return prov
}
