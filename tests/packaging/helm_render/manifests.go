package main

// The rendered files split into manifests and put in the order Helm installs them.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// installOrder: the kinds Helm installs first, in this order; other kinds (custom resources)
// follow, sorted by kind.
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

// A "---" line (with anything after the dashes on it) separates documents, as Helm splits them.
var documentSeparator = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

type manifest struct {
	templateName string
	kind         string
	text         string          // the document as rendered, trimmed
	object       json.RawMessage // the document read as the API server reads YAML
}

func sortManifests(rendered map[string]string) ([]manifest, error) {
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	var manifests []manifest
	for _, name := range names {
		for _, document := range documentSeparator.Split(strings.TrimSpace(rendered[name]), -1) {
			document = strings.TrimSpace(document)
			if document == "" {
				continue
			}
			object, err := yaml.YAMLToJSON([]byte(document))
			if err != nil {
				return nil, fmt.Errorf("YAML parse error on %s: %v\n%s", name, err, document)
			}
			if string(object) == "null" { // only comments
				continue
			}
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(object, &head); err != nil || head.Kind == "" {
				return nil, fmt.Errorf("%s renders a document that is no Kubernetes object:\n%s", name,
					document)
			}
			if _, isHook := head.Metadata.Annotations["helm.sh/hook"]; isHook {
				return nil, fmt.Errorf("%s: Helm hooks (helm.sh/hook) are not supported", name)
			}
			manifests = append(manifests, manifest{templateName: name, kind: head.Kind, text: document,
				object: object})
		}
	}
	rank := make(map[string]int, len(installOrder))
	for i, kind := range installOrder {
		rank[kind] = i
	}
	sort.SliceStable(manifests, func(i, j int) bool {
		a, aKnown := rank[manifests[i].kind]
		b, bKnown := rank[manifests[j].kind]
		switch {
		case aKnown && bKnown:
			return a < b
		case aKnown != bKnown:
			return aKnown
		default:
			return manifests[i].kind < manifests[j].kind
		}
	})
	return manifests, nil
}
