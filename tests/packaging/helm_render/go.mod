// Built in GOPATH mode (GO111MODULE=off) against Debian's Go sources in /usr/share/gocode: see
// tests/packaging/CMakeLists.txt. This file lets the /v3 import paths resolve there, and records
// the versions Debian bookworm packages.
module lockstep/tests/packaging/helm_render

go 1.19

require (
	github.com/Masterminds/semver/v3 v3.2.0
	github.com/Masterminds/sprig/v3 v3.2.3
	sigs.k8s.io/yaml v1.3.0
)
