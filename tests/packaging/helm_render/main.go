// helm_render renders a Helm chart the way `helm template` does, with Go's text/template and the
// sprig v3 function library that Helm itself uses (Helm is not packaged for Debian; both libraries
// are). The chart tests (tests/packaging/chart_test.py) read its JSON output.
//
//	helm_render --chart DIR [--values FILE]... [--release NAME] [--namespace NS]
//	            [--kube-version v1.20.0] [--api-versions GROUP/VERSION]... [--format json|yaml]
//	            [--notes FILE]
//
// --format yaml (the default) prints what `helm template` prints: each manifest after a
// "---\n# Source: CHART/templates/FILE" line. --format json prints one object
//
//	{"release": NAME, "namespace": NS, "notes": RENDERED NOTES.txt,
//	 "objects": [{"source": "templates/FILE", "object": {...}}, ...]}
//
// with every manifest parsed as the API server would read it (YAML to JSON). Either way the
// manifests come in Helm's install order (kind order, then file name, then position in the file).
// --notes also writes the rendered NOTES.txt to FILE.
//
// What Helm does that this program does not, each refused with an error: subcharts (charts/),
// hooks (helm.sh/hook), values.schema.json, "!" patterns in .helmignore, .Files.Glob/AsConfig/
// AsSecrets and toToml (unknown to the template). Rendered differently: --set does not exist;
// .Capabilities.APIVersions lists group/versions only (Helm's also has "apps/v1/Deployment"
// entries); lookup always returns an empty map, as in `helm template` without a cluster.
//
// Exit status: 0 rendered; 1 the chart does not render (the message names the template and the
// position, as Helm's does); 2 bad arguments.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"strings"
)

// repeated is a flag that may be given more than once.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

type options struct {
	chartDir    string
	valueFiles  repeated
	release     string
	namespace   string
	kubeVersion string
	apiVersions repeated
	format      string
	notesFile   string
}

func parseOptions() options {
	var o options
	flag.StringVar(&o.chartDir, "chart", "", "chart directory (holds Chart.yaml)")
	flag.Var(&o.valueFiles, "values", "values file merged over values.yaml; repeat, later wins")
	flag.StringVar(&o.release, "release", "release-name", "release name (.Release.Name)")
	flag.StringVar(&o.namespace, "namespace", "default", "release namespace (.Release.Namespace)")
	flag.StringVar(&o.kubeVersion, "kube-version", defaultKubeVersion,
		"Kubernetes version for .Capabilities and the chart's kubeVersion constraint")
	flag.Var(&o.apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions; repeat")
	flag.StringVar(&o.format, "format", "yaml", "yaml (as helm template prints) or json")
	flag.StringVar(&o.notesFile, "notes", "", "write the rendered NOTES.txt to this file")
	flag.Parse()
	if o.chartDir == "" || flag.NArg() != 0 || (o.format != "yaml" && o.format != "json") {
		flag.Usage()
		os.Exit(2)
	}
	return o
}

func main() {
	o := parseOptions()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "helm_render: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	chart, err := loadChart(o.chartDir)
	if err != nil {
		return err
	}
	values, err := userValues(o.valueFiles)
	if err != nil {
		return err
	}
	caps, err := newCapabilities(o.kubeVersion, o.apiVersions)
	if err != nil {
		return err
	}
	if err := checkKubeVersion(chart.Metadata, caps); err != nil {
		return err
	}
	top := renderValues(chart, coalesceValues(values, chart.Values), o.release, o.namespace, caps)
	rendered, err := renderTemplates(chart, top)
	if err != nil {
		return err
	}

	notesName := path.Join(chart.Metadata.Name, "templates", "NOTES.txt")
	notes := rendered[notesName]
	delete(rendered, notesName)
	manifests, err := sortManifests(rendered)
	if err != nil {
		return err
	}
	if o.notesFile != "" {
		if err := os.WriteFile(o.notesFile, []byte(notes), 0o644); err != nil {
			return err
		}
	}
	if o.format == "yaml" {
		for _, m := range manifests {
			fmt.Printf("---\n# Source: %s\n%s\n", m.templateName, m.text)
		}
		return nil
	}
	return writeJSON(o, chart.Metadata.Name, manifests, notes)
}

func writeJSON(o options, chartName string, manifests []manifest, notes string) error {
	type entry struct {
		Source string          `json:"source"`
		Object json.RawMessage `json:"object"`
	}
	out := struct {
		Release   string  `json:"release"`
		Namespace string  `json:"namespace"`
		Notes     string  `json:"notes"`
		Objects   []entry `json:"objects"`
	}{Release: o.release, Namespace: o.namespace, Notes: notes, Objects: []entry{}}
	for _, m := range manifests {
		source := strings.TrimPrefix(m.templateName, chartName+"/")
		out.Objects = append(out.Objects, entry{Source: source, Object: m.object})
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", " ")
	return encoder.Encode(out)
}
