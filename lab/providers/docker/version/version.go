// Package version holds the provider version, set at link time by build.sh:
//
//	-ldflags "-X spark-vllm.lab/providers/docker/version.Version=5.1.0"
//
// It must be a semver without a leading "v": the bridge's GetModuleMajorVersion panics otherwise.
package version

// Version is the version this stand-in claims to be (the pulumi_docker SDK asks for 5.1.0).
var Version string
