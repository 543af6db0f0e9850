package main

// The chart as Helm loads it, and the values and built-in objects its templates see.

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/Masterminds/semver/v3"
	"sigs.k8s.io/yaml"
)

// Metadata is Chart.yaml with the field names templates use (.Chart.Name, .Chart.AppVersion),
// the same as Helm's chart.Metadata.
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []*Maintainer     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []*Dependency     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
	URL   string `json:"url,omitempty"`
}

type Dependency struct {
	Name         string        `json:"name"`
	Version      string        `json:"version,omitempty"`
	Repository   string        `json:"repository"`
	Condition    string        `json:"condition,omitempty"`
	Tags         []string      `json:"tags,omitempty"`
	Enabled      bool          `json:"enabled,omitempty"`
	ImportValues []interface{} `json:"import-values,omitempty"`
	Alias        string        `json:"alias,omitempty"`
}

type chartTemplate struct {
	name string // CHART/templates/FILE, the name Helm gives it
	text string
}

type loadedChart struct {
	Metadata  *Metadata
	Values    map[string]interface{}
	Templates []chartTemplate
	Files     chartFiles
}

// chartFiles is .Files: every file of the chart that is not Chart.yaml, values.yaml or a
// template, keyed by its slash path relative to the chart.
type chartFiles map[string][]byte

// Get returns the file's text, or "" when the chart has no such file (as Helm's does).
func (f chartFiles) Get(name string) string { return string(f[name]) }

func (f chartFiles) GetBytes(name string) []byte { return f[name] }

// Lines returns the file's lines, without the newlines.
func (f chartFiles) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(string(f[name]), "\n")
}

func loadChart(dir string) (*loadedChart, error) {
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	chart := &loadedChart{Metadata: &Metadata{}, Values: map[string]interface{}{}, Files: chartFiles{}}
	if err := yaml.Unmarshal(data, chart.Metadata); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	if chart.Metadata.Name == "" || chart.Metadata.Version == "" {
		return nil, fmt.Errorf("Chart.yaml: name and version are required")
	}
	if _, err := os.Stat(filepath.Join(dir, "charts")); err == nil {
		return nil, fmt.Errorf("%s/charts: subcharts are not supported by this renderer", dir)
	}
	ignore, err := readHelmignore(filepath.Join(dir, ".helmignore"))
	if err != nil {
		return nil, err
	}
	err = filepath.Walk(dir, func(file string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, file)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if ignore.matches(rel, info.IsDir()) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if info.IsDir() {
			return nil
		}
		content, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		switch {
		case rel == "Chart.yaml" || rel == ".helmignore":
		case rel == "values.yaml":
			if err := yaml.Unmarshal(content, &chart.Values); err != nil {
				return fmt.Errorf("values.yaml: %v", err)
			}
		case rel == "values.schema.json":
			return fmt.Errorf("values.schema.json: schema validation is not supported by this renderer")
		case strings.HasPrefix(rel, "templates/"):
			chart.Templates = append(chart.Templates,
				chartTemplate{name: path.Join(chart.Metadata.Name, rel), text: string(content)})
		default:
			chart.Files[rel] = content
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if chart.Values == nil { // an empty values.yaml
		chart.Values = map[string]interface{}{}
	}
	return chart, nil
}

// helmignore holds .helmignore's patterns. Helm's rules, as far as this chart needs them: a
// pattern without a slash matches a file or directory name anywhere; one with a slash matches the
// path from the chart's root; a trailing slash matches directories only; "!" negation is not
// supported (and refused).
type helmignore []string

func readHelmignore(file string) (helmignore, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var patterns helmignore
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			return nil, fmt.Errorf(".helmignore: negated pattern %q is not supported", line)
		}
		patterns = append(patterns, line)
	}
	return patterns, scanner.Err()
}

func (h helmignore) matches(rel string, isDir bool) bool {
	for _, pattern := range h {
		dirOnly := strings.HasSuffix(pattern, "/")
		pattern = strings.TrimSuffix(pattern, "/")
		if dirOnly && !isDir {
			continue
		}
		subject := path.Base(rel)
		if strings.Contains(pattern, "/") {
			subject, pattern = rel, strings.TrimPrefix(pattern, "/")
		}
		if ok, _ := path.Match(pattern, subject); ok {
			return true
		}
	}
	return false
}

// userValues merges the --values files in order: a map merges into a map, anything else
// replaces what an earlier file set.
func userValues(files []string) (map[string]interface{}, error) {
	merged := map[string]interface{}{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		values := map[string]interface{}{}
		if err := yaml.Unmarshal(data, &values); err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		merged = mergeMaps(merged, values)
	}
	return merged, nil
}

func mergeMaps(base, override map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(base))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if overrideMap, ok := v.(map[string]interface{}); ok {
			if baseMap, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(baseMap, overrideMap)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesceValues fills the user's values with the chart's defaults. A user value of null
// removes the key (Helm's way to unset a default); a user map is filled key by key; any other
// user value wins.
func coalesceValues(user, defaults map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(defaults))
	for k, v := range user {
		out[k] = v
	}
	for k, defaultValue := range defaults {
		userValue, set := out[k]
		if !set {
			out[k] = defaultValue
			continue
		}
		if userValue == nil {
			delete(out, k)
			continue
		}
		userMap, userIsMap := userValue.(map[string]interface{})
		defaultMap, defaultIsMap := defaultValue.(map[string]interface{})
		if userIsMap && defaultIsMap {
			out[k] = coalesceValues(userMap, defaultMap)
		}
	}
	return out
}

// defaultKubeVersion is what `helm template` assumes without --kube-version (Helm 3.5's
// default), and the minor version chart_apply_test's API server serves.
const defaultKubeVersion = "v1.20.0"

// defaultAPIVersions: the group/versions a Kubernetes 1.20 API server serves.
var defaultAPIVersions = []string{
	"v1", "admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1",
	"apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1", "apiregistration.k8s.io/v1",
	"apiregistration.k8s.io/v1beta1", "apps/v1", "authentication.k8s.io/v1",
	"authentication.k8s.io/v1beta1", "authorization.k8s.io/v1", "authorization.k8s.io/v1beta1",
	"autoscaling/v1", "autoscaling/v2beta1", "autoscaling/v2beta2", "batch/v1", "batch/v1beta1",
	"certificates.k8s.io/v1", "certificates.k8s.io/v1beta1", "coordination.k8s.io/v1",
	"coordination.k8s.io/v1beta1", "discovery.k8s.io/v1beta1", "events.k8s.io/v1",
	"events.k8s.io/v1beta1", "extensions/v1beta1", "flowcontrol.apiserver.k8s.io/v1beta1",
	"networking.k8s.io/v1", "networking.k8s.io/v1beta1", "node.k8s.io/v1", "node.k8s.io/v1beta1",
	"policy/v1beta1", "rbac.authorization.k8s.io/v1", "rbac.authorization.k8s.io/v1beta1",
	"scheduling.k8s.io/v1", "scheduling.k8s.io/v1beta1", "storage.k8s.io/v1",
	"storage.k8s.io/v1beta1",
}

// Capabilities is .Capabilities, with Helm's field and method names.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion HelmVersion
}

type KubeVersion struct {
	Version string // v1.20.0
	Major   string
	Minor   string
}

func (k KubeVersion) String() string     { return k.Version }
func (k KubeVersion) GitVersion() string { return k.Version }

type VersionSet []string

// Has reports whether the API version ("apps/v1") is served.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

type HelmVersion struct {
	Version      string
	GitCommit    string
	GitTreeState string
	GoVersion    string
}

func newCapabilities(kubeVersion string, extraAPIVersions []string) (*Capabilities, error) {
	v, err := semver.NewVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("--kube-version %q: %v", kubeVersion, err)
	}
	apis := append(VersionSet{}, defaultAPIVersions...)
	apis = append(apis, extraAPIVersions...)
	sort.Strings(apis)
	return &Capabilities{
		KubeVersion: KubeVersion{Version: "v" + v.String(), Major: fmt.Sprint(v.Major()),
			Minor: fmt.Sprint(v.Minor())},
		APIVersions: apis,
		HelmVersion: HelmVersion{Version: "v3", GitTreeState: "lockstep helm_render"},
	}, nil
}

// checkKubeVersion refuses a chart whose kubeVersion constraint excludes the target version,
// as Helm does before rendering.
func checkKubeVersion(md *Metadata, caps *Capabilities) error {
	if md.KubeVersion == "" {
		return nil
	}
	constraint, err := semver.NewConstraint(md.KubeVersion)
	if err != nil {
		return fmt.Errorf("Chart.yaml kubeVersion %q: %v", md.KubeVersion, err)
	}
	version, _ := semver.NewVersion(caps.KubeVersion.Version)
	if !constraint.Check(version) {
		return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
			md.KubeVersion, caps.KubeVersion.Version)
	}
	return nil
}

// renderValues is the top-level object (".") of every template.
func renderValues(chart *loadedChart, values map[string]interface{}, release, namespace string,
	caps *Capabilities) map[string]interface{} {
	return map[string]interface{}{
		"Values": values,
		"Chart":  chart.Metadata,
		"Files":  chart.Files,
		"Release": map[string]interface{}{
			"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Capabilities": caps,
	}
}
